package daemon

import "github.com/espd/espd/metrics/metricstest"

// The scrape checks shared with package metrics' tests.
var (
	scrape          = metricstest.Scrape
	sampleValue     = metricstest.SampleValue
	parseText       = metricstest.ParseText
	checkExposition = metricstest.CheckExposition
	scrapeBody      = metricstest.ScrapeBody
	perSAFamilies   = metricstest.PerSAFamilies
)
