package xfrmguest_test

import (
	"os"
	"testing"

	"github.com/espd/espd/testbed"
)

var espdBin, espctlBin string

func TestMain(m *testing.M) {
	os.Exit(testbed.EspdMain(m, "xfrmguest", &espdBin, &espctlBin))
}
