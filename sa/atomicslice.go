package sa

import "sync/atomic"

// atomicSlice publishes an immutable slice to lock-free readers.
type atomicSlice[T any] struct{ p atomic.Pointer[[]T] }

func (a *atomicSlice[T]) load() []T {
	if p := a.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (a *atomicSlice[T]) store(s []T) { a.p.Store(&s) }
