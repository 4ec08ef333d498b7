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
//
// A timer fires late (about 0.3 ms on these machines), which would make every step end — and
// every time to first token be — that much later than the profile says. The loop learns the
// lateness (a moving average) and arms the timer that much early; a wake within it of the
// step's end finishes the step at its end. The scheduler's clock never goes back (last).
type loop struct {
	mu     sync.Mutex
	s      *scheduler
	closed bool
	last   time.Time // the latest time handed to the scheduler

	wake chan struct{} // capacity 1
	stop chan struct{}
	done chan struct{}
}

func newLoop(s *scheduler) *loop {
	l := &loop{s: s, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// maxLead bounds how early the timer is armed.
const maxLead = 500 * time.Microsecond

func (l *loop) run() {
	defer close(l.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var (
		lead         time.Duration // the timer's learnt lateness
		next, armed  time.Time     // the step end the timer is for, and when it was armed to fire
		fired, timed bool
	)
	for {
		now := time.Now()
		if fired && timed {
			lead += (now.Sub(armed) - lead) / 8
			lead = min(max(lead, 0), maxLead)
			if now.Before(next) && next.Sub(now) <= 2*lead {
				now = next // early by design: the step ends now
			}
		}
		l.mu.Lock()
		var busy bool
		next, busy = l.s.advance(l.clock(now))
		l.mu.Unlock()
		timed = busy
		if busy {
			armed = next.Add(-lead)
			t.Reset(time.Until(armed))
		} else {
			t.Stop()
		}
		fired = false
		select {
		case <-t.C:
			fired = true
		case <-l.wake:
		case <-l.stop:
			return
		}
	}
}

// clock is now, or the last time the scheduler was given if that is later; l.mu is held.
func (l *loop) clock(now time.Time) time.Time {
	if now.Before(l.last) {
		return l.last
	}
	l.last = now
	return now
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
	l.s.submit(j, l.clock(time.Now()))
	l.mu.Unlock()
	l.kick()
	return nil
}

// cancel removes j from the engine at once, freeing its slot and KV.
func (l *loop) cancel(j *job) {
	l.mu.Lock()
	if !l.closed {
		l.s.cancel(j, l.clock(time.Now()))
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
