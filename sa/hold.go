package sa

// A state's transform may be zeroed only when no worker is inside its Seal
// or Open (crypto's Zero is not safe concurrently with them). The data
// path therefore holds each state whose Encapsulator or Decapsulator it
// uses for the span of a batch's crypto, and the state's transform is
// zeroed exactly when the state is dead and not held: at removal if no
// batch holds it, else by the last Release. SA.refs counts the holds; its
// top bit says the state is dead, after which the count only goes down.

// refDead is the bit of SA.refs set when the state is removed.
const refDead = 1 << 63

// Hold takes a reference on the state for the data path: until the
// matching Release, the transform of the state's Encapsulator or
// Decapsulator stays keyed even if the state is deleted or expires
// meanwhile. Hold fails, taking nothing, once the state is dead (and for
// an SPI reservation). It never blocks and costs an atomic
// compare-and-swap or two: hold a state once per batch, not per packet,
// from its lookup until the batch's crypto is done.
func (s *SA) Hold() bool {
	for {
		r := s.refs.Load()
		if r&refDead != 0 {
			return false
		}
		if s.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// Release returns a reference taken by Hold. The last Release of a dead
// state zeroes its transform. Release without a matching Hold panics.
func (s *SA) Release() {
	r := s.refs.Add(^uint64(0)) // -1
	switch {
	case r == refDead:
		s.transform.Zero()
	case r&^refDead == ^uint64(refDead):
		panic("sa: Release of a state that is not held")
	}
}

// kill marks the state dead for Hold and zeroes its transform if no batch
// holds it; otherwise the last Release does. Called once, by removeLocked.
func (s *SA) kill() {
	if s.refs.Or(refDead) == 0 {
		s.transform.Zero()
	}
}
