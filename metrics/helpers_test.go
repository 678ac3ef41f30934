package metrics

import (
	"log/slog"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/metrics/metricstest"
	"github.com/espd/espd/sa"
)

// The scrape checks shared with daemon's tests.
var (
	scrape       = metricstest.Scrape
	sampleValue  = metricstest.SampleValue
	parseText    = metricstest.ParseText
	countPrefix  = metricstest.CountPrefix
	familySeries = metricstest.FamilySeries
)

// newMetrics returns the handler over db and dp alone, with per-state
// series for at most perSA states.
func newMetrics(db *sa.DB, dp func() dataplane.Stats, perSA int, log *slog.Logger) *Handler {
	return New(Sources{DB: db, Dataplane: dp, PerSA: perSA, AES: crypto.AESAccelerated(), Log: log})
}
