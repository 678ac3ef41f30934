package sa

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
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
	b.Drop(DropReason(200), 2) // out of range: malformed
	if err := db.DeleteSA(0x5100, remote); err != nil {
		t.Fatal(err)
	}
	g := db.Stats()
	want := GlobalStats{States: 1, Larval: 1, Policies: 1, Packets: 15, Bytes: 1500}
	want.Drops[DropReplay], want.Drops[DropMalformed] = 3, 2
	if g != want {
		t.Errorf("Stats() = %+v\nwant       %+v", g, want)
	}
	if st := b.Stats(); st.Drops[DropReplay] != 3 || st.Drops[DropMalformed] != 2 {
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
		esp.ErrOuter:                             DropMalformed,
		esp.ErrHeadroom:                          DropTooBig,
		errors.New("something else"):             DropMalformed,
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

// TestStatsOutsideTheLock: Stats sums the states after releasing the
// state lock, so AddSA and DeleteSA run while it sums (they would
// deadlock here otherwise). A state deleted between the copy of the list
// and the sum counts once, with what it had when it was removed and what
// was counted on it afterwards, and the next Stats agrees; a state added
// meanwhile counts from the next Stats.
func TestStatsOutsideTheLock(t *testing.T) {
	db, _ := newTestDB(t)
	a := mustAdd(t, db, testConfig(0x5200, DirIn, 1))
	b := mustAdd(t, db, testConfig(0x5201, DirIn, 2))
	a.Account(10, 1000)
	b.Account(1, 100)
	b.Drop(DropIntegrity, 4)
	var added *SA
	statsCopied = func() {
		statsCopied = nil
		b.Account(2, 200) // counted: b is installed when Stats reads it
		a.Account(5, 500)
		if err := db.DeleteSA(0x5200, local); err != nil {
			t.Error(err)
		}
		a.Account(100, 10000) // after its removal: counted once (foldLate)
		added = mustAdd(t, db, testConfig(0x5202, DirIn, 3))
		added.Account(7, 700)
	}
	defer func() { statsCopied = nil }()
	g := db.Stats()
	want := GlobalStats{States: 2, Packets: 15 + 100 + 3, Bytes: 1500 + 10000 + 300}
	want.Drops[DropIntegrity] = 4
	if g != want {
		t.Errorf("Stats() during changes = %+v\nwant                     %+v", g, want)
	}
	g = db.Stats()
	want.Packets, want.Bytes = 15+100+3+7, 1500+10000+300+700
	if g != want {
		t.Errorf("Stats() after them = %+v\nwant                 %+v", g, want)
	}
}

// TestStatsNeverGoDown: while states carry traffic and are deleted and
// added again, the totals of successive Stats calls never go down (a
// removed state's packets counted after its removal, which the removal
// did not see, must not count in one Stats and be gone from the next).
func TestStatsNeverGoDown(t *testing.T) {
	db, _ := newTestDB(t)
	const n = 64
	for i := range n {
		mustAdd(t, db, testConfig(0x5300+uint32(i), DirIn, 1))
	}
	var stop atomic.Bool
	var churned atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { // traffic
		for i := 0; !stop.Load(); i++ {
			// Like a batch, it keeps the state it found for a while:
			// some of its packets are counted after the state's removal.
			if s := db.LookupInbound(0x5300 + uint32(i%n)); s != nil {
				for range 100 {
					s.Account(1, 100)
					s.Drop(DropReplay, 1)
				}
			}
		}
	})
	wg.Go(func() { // churn
		for i := 0; !stop.Load(); i++ {
			spi := 0x5300 + uint32(i%n)
			if err := db.DeleteSA(spi, local); err != nil {
				t.Error(err)
				return
			}
			if _, err := db.AddSA(testConfig(spi, DirIn, 1)); err != nil {
				t.Error(err)
				return
			}
			churned.Add(1)
		}
	})
	var last GlobalStats
	for i := 0; i < 2000 || churned.Load() < 2000; i++ {
		g := db.Stats()
		if g.Packets < last.Packets || g.Bytes < last.Bytes || g.Drops[DropReplay] < last.Drops[DropReplay] {
			t.Fatalf("totals went down: %+v after %+v", g, last)
		}
		last = g
	}
	stop.Store(true)
	wg.Wait()
	if last.Packets == 0 {
		t.Error("no traffic was counted")
	}
}

// TestDropReasonOfTotal lists the exported Err* variables of esp and
// crypto from their sources (what Encapsulate, Open, ReplayWindow.Update
// and the transforms return is among them) and requires each to be in
// errs below and to have a reason of its own in DropReasonOf, rather than
// the fallback for an error it does not know.
func TestDropReasonOfTotal(t *testing.T) {
	errs := map[string]error{
		"esp.ErrReplay": esp.ErrReplay, "esp.ErrPadding": esp.ErrPadding,
		"esp.ErrMalformed": esp.ErrMalformed, "esp.ErrDummy": esp.ErrDummy,
		"esp.ErrECNDrop": esp.ErrECNDrop, "esp.ErrNextHeader": esp.ErrNextHeader,
		"esp.ErrInner": esp.ErrInner, "esp.ErrTransport": esp.ErrTransport, "esp.ErrHeadroom": esp.ErrHeadroom,
		"esp.ErrTailroom": esp.ErrTailroom, "esp.ErrTooBig": esp.ErrTooBig,
		"esp.ErrOuter":             esp.ErrOuter,
		"crypto.ErrAuthentication": crypto.ErrAuthentication,
		"crypto.ErrMalformed":      crypto.ErrMalformed,
	}
	found := map[string]bool{}
	for _, pkg := range []string{"esp", "crypto"} {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, spec := range g.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						if id.IsExported() && strings.HasPrefix(id.Name, "Err") {
							found[pkg+"."+id.Name] = true
						}
					}
				}
			}
		}
	}
	if len(found) == 0 {
		t.Fatal("no Err* variables found in ../esp and ../crypto")
	}
	for name := range found {
		err, ok := errs[name]
		if !ok {
			t.Errorf("%s is not in this test's list: add it, and its reason to DropReasonOf", name)
			continue
		}
		r, known := dropReasonOf(err)
		if !known {
			t.Errorf("DropReasonOf(%s) has no reason of its own (falls back to %v)", name, r)
		}
		if wrapped, _ := dropReasonOf(fmt.Errorf("wrapped: %w", err)); wrapped != r {
			t.Errorf("DropReasonOf(wrapped %s) = %v, want %v", name, wrapped, r)
		}
	}
	for name := range errs {
		if !found[name] {
			t.Errorf("%s is in this test's list but not declared in the sources", name)
		}
	}
	if r, known := dropReasonOf(errors.New("something else")); known || r != DropMalformed {
		t.Errorf("an unknown error: %v, known %v; want malformed, not known", r, known)
	}
}

// TestCountedAfterRemoval: what the data path counts on a state after its
// removal (a batch that held it when it was removed) reaches the DB's
// totals, once: here by hand, then from goroutines counting while the
// state is deleted.
func TestCountedAfterRemoval(t *testing.T) {
	db, _ := newTestDB(t)
	a := mustAdd(t, db, testConfig(0x5200, DirOut, 1))
	a.Drop(DropSequence, 1)
	if err := db.DeleteSA(0x5200, remote); err != nil {
		t.Fatal(err)
	}
	a.Drop(DropSequence, 2)
	a.Account(3, 300)
	for range 2 { // the second Stats sees no more
		g := db.Stats()
		if g.Drops[DropSequence] != 3 || g.Packets != 3 || g.Bytes != 300 {
			t.Errorf("DB totals: %d sequence drops, %d packets, %d bytes; want 3, 3, 300", g.Drops[DropSequence], g.Packets, g.Bytes)
		}
	}
	if st := a.Stats(); st.Drops[DropSequence] != 3 || st.Packets != 3 {
		t.Errorf("state: %d sequence drops, %d packets; want 3, 3", st.Drops[DropSequence], st.Packets)
	}

	const workers, each = 4, 2000
	for round := range 20 {
		spi := uint32(0x5300 + round)
		b := mustAdd(t, db, testConfig(spi, DirOut, 2))
		before := db.Stats()
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range each {
					b.Drop(DropReplay, 1)
					b.Account(1, 10)
				}
			})
		}
		for b.Stats().Drops[DropReplay] == 0 { // delete while they count
			runtime.Gosched()
		}
		if err := db.DeleteSA(spi, remote); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		g := db.Stats()
		if d, p := g.Drops[DropReplay]-before.Drops[DropReplay], g.Packets-before.Packets; d != workers*each || p != workers*each {
			t.Fatalf("round %d: %d replay drops and %d packets reached the totals, want %d each", round, d, p, workers*each)
		}
	}
}
