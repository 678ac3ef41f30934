package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// TestCPUAES: espd_cpu_aes is Sources.AES, 1 or 0, a gauge (daemon's
// TestSlowAESWarning sees the 0 of a CPU without AES instructions through
// a running daemon).
func TestCPUAES(t *testing.T) {
	for _, aes := range []bool{true, false} {
		c := &collector{db: sa.NewDB(sa.Options{}), dp: func() dataplane.Stats { return dataplane.Stats{} }, aes: aes}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		want, found := 0.0, false
		if aes {
			want = 1
		}
		for _, mf := range mfs {
			if mf.GetName() == "espd_cpu_aes" {
				found = true
				if got := mf.GetMetric()[0].GetGauge().GetValue(); got != want {
					t.Errorf("espd_cpu_aes %v with AES %v, want %v", got, aes, want)
				}
			}
		}
		if !found {
			t.Errorf("no espd_cpu_aes with AES %v", aes)
		}
	}
}
