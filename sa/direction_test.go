package sa

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/espd/espd/seqstore"
)

// TestKeyOneDirection: a key used outbound (up to 2^32+100, ESN) and
// deleted is refused inbound, and an inbound key outbound, after the
// delete in the same DB and after a restart over the real seqstore; in
// its own direction it is taken again.
func TestKeyOneDirection(t *testing.T) {
	for _, dirs := range [][2]Direction{{DirOut, DirIn}, {DirIn, DirOut}} {
		t.Run(fmt.Sprintf("%v then %v", dirs[0], dirs[1]), func(t *testing.T) {
			dir := t.TempDir()
			open := func() (*seqstore.Store, *DB) {
				st, err := seqstore.Open(dir, seqstore.Options{})
				if err != nil {
					t.Fatal(err)
				}
				return st, newStoreDB(t, st, 1<<10)
			}
			first := testConfig(0x6600, dirs[0], 1)
			first.Suite = gcm128ESN
			if dirs[0] == DirOut {
				first.OSeq = 1 << 32
			}
			second := testConfig(0x6601, dirs[1], 2)
			second.Suite = gcm128ESN
			second.EncKey = first.EncKey
			want := fmt.Sprintf("dir %v: key %s was used dir %v before", dirs[1], fpString(fpOf(first)), dirs[0])
			refused := func(db *DB, when string) {
				t.Helper()
				s, err := db.AddSA(second)
				if err == nil {
					t.Fatalf("%s: key used %v added %v (spi 0x%08x)", when, dirs[0], dirs[1], s.SPI())
				}
				if !errors.Is(err, ErrKeyDirection) || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v, want ErrKeyDirection saying %q", when, err, want)
				}
			}

			st, db := open()
			s := mustAdd(t, db, first)
			if dirs[0] == DirOut {
				mustReserve(t, s, 100, 1<<32+1)
			}
			if err := db.DeleteSA(s.SPI(), s.Config().Dst); err != nil {
				t.Fatal(err)
			}
			refused(db, "after delete")
			must(t, st.Close())

			st, db = open()
			defer st.Close()
			refused(db, "after restart")
			s = mustAdd(t, db, first) // its own direction
			if dirs[0] == DirOut && s.Stats().SeqOut < 1<<32+100 {
				t.Errorf("outbound key added again at %d, below what it sent", s.Stats().SeqOut)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
