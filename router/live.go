package router

import (
	"context"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/fleet"
)

// Live runs a Router in real time for concurrent callers, as raft's node wraps its RawNode:
// it serializes calls with a mutex, hands each waiting offer its outcome when the router
// produces it, and applies time (wait limits, first-token timeouts) from a timer goroutine
// started by Run. All decisions stay in the Router.
type Live struct {
	now func() time.Time

	mu      sync.Mutex
	r       *Router
	waiters map[Handle]chan Outcome
	hooks   Hooks
	armed   time.Time     // when Run's timer fires next (under mu)
	changed chan struct{} // closed at the next change; nil while no one waits (Changed)
	taken   Output        // the router's output (Take), under mu

	kick chan struct{}
	pool sync.Pool
}

// Hooks receive what the router raises for others to act on. Each is called outside the
// router's lock, from the goroutine whose call raised it; nil hooks are skipped.
type Hooks struct {
	// Trigger receives every urgent-wake trigger (for the controller).
	Trigger func(Trigger)
	// Eject receives every passive-health ejection (for the fleet: mark the engine failed).
	Eject func(Ejection)
}

// NewLive wraps r. now is the clock (time.Now in production).
func NewLive(r *Router, now func() time.Time, h Hooks) *Live {
	return &Live{
		r: r, now: now, hooks: h,
		waiters: map[Handle]chan Outcome{},
		kick:    make(chan struct{}, 1),
		pool:    sync.Pool{New: func() any { return make(chan Outcome, 1) }},
	}
}

// Run applies time until ctx is done: it ticks the router at its next deadline.
func (l *Live) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		now := l.now()
		l.r.Tick(now)
		rs := l.flush()
		next, ok := l.r.NextDeadline()
		wait := time.Hour
		if ok {
			wait = max(next.Sub(now), time.Millisecond)
		}
		l.armed = now.Add(wait)
		l.mu.Unlock()
		l.fire(rs)
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-l.kick: // Reset above discards a stale tick (Go 1.23 timers)
		}
	}
}

// flush acts on the router's output — each outcome to its waiting offer — and wakes Run when
// the router now has a deadline before Run's timer; call with the lock held. It returns what
// the hooks get (outcomes delivered, ejections copied: they outlive the lock): call fire with
// it after unlocking.
func (l *Live) flush() Output {
	l.signal()
	l.r.Take(&l.taken)
	for _, o := range l.taken.Outcomes {
		if ch, ok := l.waiters[o.Handle]; ok {
			delete(l.waiters, o.Handle)
			ch <- o
		}
	}
	out := Output{Trigger: l.taken.Trigger, Urgent: l.taken.Urgent}
	if len(l.taken.Ejections) > 0 {
		out.Ejections = append([]Ejection(nil), l.taken.Ejections...) // rare; fired after the lock
	}
	if next, ok := l.r.NextDeadline(); ok && next.Before(l.armed) {
		l.armed = next
		l.wake()
	}
	return out
}

// fire hands the hooks what flush returned.
func (l *Live) fire(out Output) {
	if out.Urgent && l.hooks.Trigger != nil {
		l.hooks.Trigger(out.Trigger)
	}
	if l.hooks.Eject != nil {
		for _, e := range out.Ejections {
			l.hooks.Eject(e)
		}
	}
}

// signal tells those waiting on Changed that the router may have changed; call with the lock
// held. Nothing is allocated while no one waits.
func (l *Live) signal() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Changed returns a channel closed at the router's next change: any call that may change its
// state (an offer, a response event, a fleet change, a tick of Run). Await is the loop most
// callers want.
func (l *Live) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// Await waits until cond holds for the router's snapshot, checking it now and after each change,
// or until ctx is done (ctx's error then).
func (l *Live) Await(ctx context.Context, cond func(Snapshot) bool) error {
	for {
		ch := l.Changed() // before the check: a change after it closes ch
		if cond(l.Snapshot()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// wake makes Run recompute its deadline (a new earliest deadline may exist).
func (l *Live) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Offer offers a request and waits until it is dispatched or rejected, or ctx is done. When
// ctx ends first the request is cancelled (cancelled.waiting, or cancelled.in_flight if it was
// dispatched meanwhile) and ctx's error is returned.
func (l *Live) Offer(ctx context.Context, o Offer) (Outcome, error) {
	l.mu.Lock()
	out := l.r.Offer(l.now(), o)
	var ch chan Outcome
	if out.Status == Waiting {
		ch = l.pool.Get().(chan Outcome)
		l.waiters[out.Handle] = ch
	}
	rs := l.flush()
	l.mu.Unlock()
	l.fire(rs)
	if ch == nil {
		return out, nil
	}
	select {
	case res := <-ch:
		l.pool.Put(ch)
		return res, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if _, still := l.waiters[out.Handle]; still {
		delete(l.waiters, out.Handle)
		_ = l.r.Cancel(l.now(), out.Handle)
	} else if res := <-ch; res.Status == Dispatched {
		_ = l.r.Cancel(l.now(), out.Handle) // placed as the client left
	}
	rs = l.flush()
	l.mu.Unlock()
	l.pool.Put(ch)
	l.fire(rs)
	return Outcome{}, ctx.Err()
}

// step runs one router event under the lock and delivers what it produced.
func (l *Live) step(fn func(now time.Time) error) error {
	l.mu.Lock()
	err := fn(l.now())
	rs := l.flush()
	l.mu.Unlock()
	l.fire(rs)
	return err
}

// Invalid counts an invalid offer.
func (l *Live) Invalid() {
	l.mu.Lock()
	l.r.Invalid()
	l.signal()
	l.mu.Unlock()
}

// FirstToken records a request's first token.
func (l *Live) FirstToken(h Handle) error {
	return l.step(func(now time.Time) error { return l.r.FirstToken(now, h) })
}

// Complete records a request's end with its output tokens (0 when unknown).
func (l *Live) Complete(h Handle, outputTokens int) error {
	return l.step(func(now time.Time) error { return l.r.Complete(now, h, outputTokens) })
}

// Fail records a dispatched request's failure; why says whether it counts against the engine.
func (l *Live) Fail(h Handle, why Failure) error {
	return l.step(func(now time.Time) error { return l.r.Fail(now, h, why) })
}

// Shutdown rejects every waiting request (ShuttingDown) and every later offer.
func (l *Live) Shutdown() {
	_ = l.step(func(now time.Time) error { l.r.Shutdown(now); return nil })
}

// Cancel records a client cancel of a dispatched request.
func (l *Live) Cancel(h Handle) error {
	return l.step(func(now time.Time) error { return l.r.Cancel(now, h) })
}

// SetFleet applies a fleet snapshot.
func (l *Live) SetFleet(snap fleet.Snapshot) {
	_ = l.step(func(now time.Time) error { l.r.SetFleet(now, snap); return nil })
}

// Follow applies the fleet's changes until ctx is done.
func (l *Live) Follow(ctx context.Context, f *fleet.Fleet) {
	ch, cancel := f.Subscribe()
	defer cancel()
	l.SetFleet(f.Snapshot())
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			l.SetFleet(f.Snapshot())
		}
	}
}

// PassThrough picks the engine a request Narwhal does not place goes to (Router.PassThrough).
func (l *Live) PassThrough(kind PassKind, only []string) (addr string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	addr, ok = l.r.PassThrough(l.now(), kind, only)
	l.signal()
	return addr, ok
}

// Observe applies one reading of an engine's metrics (nil: they could not be read).
func (l *Live) Observe(id string, o *Observation) (got Observed, ok bool) {
	_ = l.step(func(now time.Time) error { got, ok = l.r.Observe(now, id, o); return nil })
	return got, ok
}

// Snapshot reports the router's state.
func (l *Live) Snapshot() Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Snapshot(l.now())
}

// Do runs fn with the router under the lock (the controller prices splits this way); outcomes
// fn produces are delivered.
func (l *Live) Do(fn func(now time.Time, r *Router)) {
	_ = l.step(func(now time.Time) error { fn(now, l.r); return nil })
}
