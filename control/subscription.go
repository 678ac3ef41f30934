package control

import (
	"sync"
	"sync/atomic"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// Subscription is an event stream a Backend gives the server for one
// subscriber. Events must never wait for the subscriber: when its buffer
// is full they are dropped and counted in Dropped.
type Subscription interface {
	// Events returns the channel of events; Close closes it.
	Events() <-chan wire.Event
	// Dropped returns how many events were dropped so far.
	Dropped() uint64
	// Close ends the subscription. It may be called more than once.
	Close()
}

// dbSubscription adapts an *sa.Subscription.
type dbSubscription struct {
	sub     *sa.Subscription
	ch      chan wire.Event
	dropped atomic.Uint64
	once    sync.Once
	done    chan struct{}
}

// SubscribeDB subscribes to the events of db, for Backend implementations
// over sa.DB. The events are converted with wire.EventFromSA by one
// goroutine, which ends when the subscription is closed.
func SubscribeDB(db *sa.DB, buffer int) Subscription {
	buffer = max(buffer, 1)
	s := &dbSubscription{sub: db.Subscribe(buffer), ch: make(chan wire.Event, buffer), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *dbSubscription) run() {
	defer close(s.ch)
	for {
		select {
		case e, ok := <-s.sub.Events():
			if !ok {
				return
			}
			select {
			case s.ch <- wire.EventFromSA(e):
			default:
				s.dropped.Add(1)
			}
		case <-s.done:
			return
		}
	}
}

func (s *dbSubscription) Events() <-chan wire.Event { return s.ch }

func (s *dbSubscription) Dropped() uint64 { return s.sub.Dropped() + s.dropped.Load() }

func (s *dbSubscription) Close() {
	s.once.Do(func() {
		s.sub.Close()
		close(s.done)
	})
}
