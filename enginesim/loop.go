package enginesim

import (
	"errors"
	"sync"
	"time"
)

// errClosed is returned to requests submitted after the engine closed.
var errClosed = errors.New("enginesim: engine closed")

// loop runs a scheduler in real time: one goroutine sleeps until the end of the step in
// progress and advances the schedule; submit and cancel advance it from the caller's goroutine
// (so an arrival at an idle engine starts its step at the arrival time) and wake the goroutine
// to re-arm its timer. The mutex guards the scheduler and is never held while writing to a
// client.
type loop struct {
	mu     sync.Mutex
	s      *scheduler
	closed bool

	wake chan struct{} // capacity 1
	stop chan struct{}
	done chan struct{}
}

func newLoop(s *scheduler) *loop {
	l := &loop{s: s, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

func (l *loop) run() {
	defer close(l.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		next, busy := l.s.advance(time.Now())
		l.mu.Unlock()
		if busy {
			t.Reset(time.Until(next))
		} else {
			t.Stop()
		}
		select {
		case <-t.C:
		case <-l.wake:
		case <-l.stop:
			return
		}
	}
}

func (l *loop) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// submit hands j to the scheduler.
func (l *loop) submit(j *job) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errClosed
	}
	l.s.submit(j, time.Now())
	l.mu.Unlock()
	l.kick()
	return nil
}

// cancel removes j from the engine at once, freeing its slot and KV.
func (l *loop) cancel(j *job) {
	l.mu.Lock()
	if !l.closed {
		l.s.cancel(j, time.Now())
	}
	l.mu.Unlock()
	l.kick()
}

// snapshot reports the current load.
func (l *loop) snapshot() snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.snapshot()
}

// setTracer installs t (tests and benchmarks only).
func (l *loop) setTracer(t tracer) {
	l.mu.Lock()
	l.s.trace = t
	l.mu.Unlock()
}

// close fails every pending job and stops the goroutine. It is idempotent.
func (l *loop) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.s.failAll()
	l.mu.Unlock()
	close(l.stop)
	<-l.done
}
