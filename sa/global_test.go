package sa

import (
	"errors"
	"fmt"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

func TestGlobalStats(t *testing.T) {
	db, _ := newTestDB(t)
	a := mustAdd(t, db, testConfig(0x5100, DirOut, 1))
	b := mustAdd(t, db, testConfig(0x5101, DirIn, 1))
	db.AddPolicy(Policy{Dir: DirOut})
	if _, err := db.AllocSPI(0x6000, 0x6fff); err != nil {
		t.Fatal(err)
	}
	a.Account(10, 1000)
	b.Account(5, 500)
	b.Drop(DropReplay, 3)
	b.Drop(DropReason(200), 2) // out of range: other
	if err := db.DeleteSA(0x5100, remote); err != nil {
		t.Fatal(err)
	}
	g := db.Stats()
	want := GlobalStats{States: 1, Larval: 1, Policies: 1, Packets: 15, Bytes: 1500}
	want.Drops[DropReplay], want.Drops[DropOther] = 3, 2
	if g != want {
		t.Errorf("Stats() = %+v\nwant       %+v", g, want)
	}
	if st := b.Stats(); st.Drops[DropReplay] != 3 || st.Drops[DropOther] != 2 {
		t.Errorf("state drops %v", st.Drops)
	}
}

func TestDropReasonOf(t *testing.T) {
	cases := map[error]DropReason{
		esp.ErrReplay:                            DropReplay,
		crypto.ErrAuthentication:                 DropIntegrity,
		esp.ErrPadding:                           DropPadding,
		esp.ErrMalformed:                         DropMalformed,
		crypto.ErrMalformed:                      DropMalformed,
		esp.ErrNextHeader:                        DropNextHeader,
		esp.ErrInner:                             DropInner,
		esp.ErrDummy:                             DropDummy,
		esp.ErrECNDrop:                           DropECN,
		esp.ErrTooBig:                            DropTooBig,
		esp.ErrTailroom:                          DropTooBig,
		errors.New("something else"):             DropOther,
		fmt.Errorf("wrapped: %w", esp.ErrReplay): DropReplay,
	}
	for err, want := range cases {
		if got := DropReasonOf(err); got != want {
			t.Errorf("DropReasonOf(%v) = %v, want %v", err, got, want)
		}
	}
	for r := range NumDropReasons {
		if r.String() == "" || r.String()[0] == 'd' && r != DropDummy {
			t.Errorf("reason %d has no name: %q", r, r.String())
		}
	}
}
