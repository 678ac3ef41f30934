package sa

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLFTableAgainstMap runs random operations on an lfTable and a map and
// compares them, through growth and shrinking.
func TestLFTableAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tab := newLFTable[u32Key, int]()
	ref := map[u32Key]int{}
	for i := range 200000 {
		k := u32Key(r.IntN(3000))
		switch r.IntN(3) {
		case 0, 1:
			_, had := ref[k]
			if got := tab.put(k, i); got != had {
				t.Fatalf("put(%d) replaced = %v, want %v", k, got, had)
			}
			ref[k] = i
		case 2:
			_, had := ref[k]
			if got := tab.remove(k); got != had {
				t.Fatalf("remove(%d) = %v, want %v", k, got, had)
			}
			delete(ref, k)
		}
		if tab.len() != len(ref) {
			t.Fatalf("len = %d, want %d", tab.len(), len(ref))
		}
	}
	for k := range u32Key(3000) {
		v, ok := tab.get(k)
		w, wok := ref[k]
		if ok != wok || v != w {
			t.Fatalf("get(%d) = %d, %v; want %d, %v", k, v, ok, w, wok)
		}
	}
	n := 0
	tab.all(func(k u32Key, v int) bool {
		if ref[k] != v {
			t.Fatalf("all: %d = %d, want %d", k, v, ref[k])
		}
		n++
		return true
	})
	if n != len(ref) {
		t.Fatalf("all visited %d, want %d", n, len(ref))
	}
	tab.clear()
	if _, ok := tab.get(1); ok || tab.len() != 0 {
		t.Fatal("clear left entries")
	}
}

// TestLFTableConcurrentReaders checks under -race that readers see either
// the old or the new value of keys a writer keeps changing, and always see
// keys that are never removed.
func TestLFTableConcurrentReaders(t *testing.T) {
	tab := newLFTable[u32Key, int]()
	const stable = 100
	for k := range u32Key(stable) {
		tab.put(k, int(k))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for k := range u32Key(stable) {
					if v, ok := tab.get(k); !ok || v != int(k) {
						bad.Add(1)
					}
				}
			}
		}()
	}
	for i := range 20000 {
		k := u32Key(stable + i%5000)
		if i%3 == 0 {
			tab.remove(k)
		} else {
			tab.put(k, i)
		}
	}
	stop.Store(true)
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("readers missed stable keys %d times", bad.Load())
	}
}
