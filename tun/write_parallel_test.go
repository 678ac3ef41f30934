package tun

import (
	"sync"
	"testing"
	"time"
)

// TestWriteParallel runs two writers at once, as two shards' in-order
// stages, while another caller holds the ring (Device.wmu) and is stuck
// in the descriptor's write (holding its write lock, as a writer waiting
// in the poller does): neither writer waits for it or for the other, each
// packet is written once, and with the ring taken the writers use
// writev(2). Then a Write takes the free ring again.
func TestWriteParallel(t *testing.T) {
	d := createInternal(t, "esptest12")
	if d.URingErr() != nil {
		t.Logf("io_uring unavailable (%v): writev only", d.URingErr())
	}
	release := make(chan struct{})
	entered := make(chan struct{})
	stuck := make(chan struct{})
	d.wmu.Lock()
	go func() {
		defer close(stuck)
		d.rc.Write(func(uintptr) bool {
			close(entered)
			<-release
			return true
		})
	}()
	defer func() {
		close(release)
		<-stuck
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		d.wmu.Unlock()
		t.Fatal("could not take the descriptor's write lock within 30 s")
	}

	const writers, rounds, n = 2, 50, 16
	before := d.Stats()
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := batch(t, n, 16)
			for range rounds {
				if errs[w] = d.Write(bufs, 16); errs[w] != nil {
					return
				}
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		d.wmu.Unlock()
		<-finished
		t.Fatal("a writer waited 30 s: writers wait for a stuck one or for each other")
	}
	d.wmu.Unlock()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", w, err)
		}
	}
	s := d.Stats()
	if got := s.WritePackets - before.WritePackets; got != writers*rounds*n {
		t.Errorf("%d packets written, want %d", got, writers*rounds*n)
	}
	if s.URingEnters != before.URingEnters {
		t.Errorf("%d io_uring_enter calls while the ring was taken", s.URingEnters-before.URingEnters)
	}
	if d.URingErr() == nil {
		if err := d.Write(batch(t, 8, 16), 16); err != nil {
			t.Fatal(err)
		}
		if d.Stats().URingEnters == s.URingEnters {
			t.Error("the free ring was not used")
		}
	}
}
