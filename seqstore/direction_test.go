package seqstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A key serves one direction, for ever: used outbound, it is refused
// inbound, and the reverse, while in use, after its retirement and
// across a reopen.
func TestOneDirection(t *testing.T) {
	k := fp(1)
	outbound := func(s *Store) error {
		v, err := s.Resume(k, false)
		if err != nil {
			return err
		}
		if err := s.Reserve(k, v+1<<20); err != nil {
			return err
		}
		return s.Retire(k, v+10)
	}
	inbound := func(s *Store) error {
		if err := s.Inbound(k, false); err != nil {
			return err
		}
		return s.RetireInbound(k)
	}
	for _, tc := range []struct {
		first, second string
		use, other    func(*Store) error
	}{
		{"outbound", "inbound", outbound, inbound},
		{"inbound", "outbound", inbound, outbound},
	} {
		t.Run(tc.first+" then "+tc.second, func(t *testing.T) {
			dir := stateDir(t)
			s := open(t, dir, Options{})
			must(t, tc.use(s))
			check := func(when string) {
				err := tc.other(s)
				if !errors.Is(err, ErrDirection) {
					t.Fatalf("%s: a key used %s, then %s: %v, want ErrDirection", when, tc.first, tc.second, err)
				}
				for _, want := range []string{fmt.Sprintf("%x", k[:8]), "used " + tc.first, "cannot be used " + tc.second} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%s: error %q does not say %q", when, err, want)
					}
				}
				out, in, err := s.Used(k)
				must(t, err)
				if out != (tc.first == "outbound") || in != (tc.first == "inbound") {
					t.Errorf("%s: Used = %v, %v", when, out, in)
				}
			}
			check("retired")
			must(t, s.Close())
			s = open(t, dir, Options{})
			defer s.Close()
			check("reopened")
			must(t, tc.use(s)) // its own direction still works
		})
	}
	t.Run("while in use", func(t *testing.T) {
		s := open(t, stateDir(t), Options{})
		defer s.Close()
		must(t, s.Inbound(k, true))
		if _, err := s.Resume(k, true); !errors.Is(err, ErrDirection) {
			t.Errorf("Resume of a key in use inbound: %v", err)
		}
		if _, err := s.Resume(fp(2), true); err != nil {
			t.Fatal(err)
		}
		if err := s.Inbound(fp(2), true); !errors.Is(err, ErrDirection) {
			t.Errorf("Inbound of a key resumed outbound: %v", err)
		}
	})
}

// Inbound records follow the retention rules of outbound ones: a
// manual key's is kept for ever, a negotiated key's is dropped Retain
// after its last inbound state went, never while one uses it.
func TestInboundRetention(t *testing.T) {
	const retain = time.Hour
	for _, negotiated := range []bool{false, true} {
		t.Run(fmt.Sprintf("negotiated %v", negotiated), func(t *testing.T) {
			dir := stateDir(t)
			clk := &fakeClock{t: time.Unix(1e9, 0)}
			o := Options{Retain: retain, now: clk.now, minCompact: 1}
			s := open(t, dir, o)
			must(t, s.Inbound(fp(1), negotiated))
			must(t, s.Inbound(fp(1), negotiated)) // a second state
			must(t, s.Inbound(fp(2), negotiated)) // never retired
			must(t, s.RetireInbound(fp(1)))
			clk.add(10 * retain)
			must(t, s.Close())
			s = open(t, dir, o)
			if _, in, _ := s.Used(fp(1)); !in {
				t.Fatal("key dropped while an inbound state used it")
			}
			must(t, s.Inbound(fp(1), negotiated))
			must(t, s.RetireInbound(fp(1)))
			must(t, s.RetireInbound(fp(1))) // of the last run's state: no session, nothing
			clk.add(2 * retain)
			must(t, s.Close())
			s = open(t, dir, o)
			defer s.Close()
			_, in, _ := s.Used(fp(1))
			if in == negotiated {
				t.Errorf("retired inbound key 2 Retain ago: recorded %v, want %v", in, !negotiated)
			}
			if _, in, _ := s.Used(fp(2)); !in {
				t.Error("inbound key never retired was dropped")
			}
		})
	}
}
