package system

import (
	"errors"
	"testing"
)

// TestEspdBaseline: the baseline systems run Env.BaselineBin, and without
// one they are skipped with the flag that enables them.
func TestEspdBaseline(t *testing.T) {
	var base, cur *Espd
	for _, s := range All() {
		switch s.Name() {
		case "espd-baseline":
			base = s.(*Espd)
		case "espd":
			cur = s.(*Espd)
		}
	}
	if base == nil || cur == nil {
		t.Fatal("All() lacks espd or espd-baseline")
	}
	var skip *SkipError
	if err := base.Available(&Env{EspdBin: "/x/espd"}); !errors.As(err, &skip) || skip.Enable != "-espd-baseline BIN" {
		t.Errorf("espd-baseline without a binary: %v", err)
	}
	env := &Env{EspdBin: "/x/espd", BaselineBin: "/y/espd"}
	if err := base.Available(env); err != nil {
		t.Errorf("espd-baseline with a binary: %v", err)
	}
	if base.bin(env) != "/y/espd" || cur.bin(env) != "/x/espd" {
		t.Errorf("binaries: baseline %s, espd %s", base.bin(env), cur.bin(env))
	}
}
