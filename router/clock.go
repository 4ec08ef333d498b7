package router

// Time: the wait limits and first-token timeouts Tick applies, and NextDeadline.

import (
	"math"
	"time"
)

// Tick applies time: waiting requests past router.waiting_set.max_wait_s are rejected
// (wait_timeout, through Take), dispatched requests with no first token after
// router.first_token_timeout_s are counted, and the waiting set is pumped.
func (r *Router) Tick(now time.Time) {
	t := r.at(now)
	r.demand.expire(t)
	r.decay(t)
	for r.waiting.len() > 0 {
		h, _ := r.waiting.peek()
		e, slot, err := r.lookup(h)
		if err != nil || e.phase != phaseWaiting {
			r.waiting.pop()
			continue
		}
		if e.arrival+r.cfg.WaitingSet.MaxWaitS > t {
			break
		}
		r.waiting.pop()
		r.turnAway(h, e, slot, WaitTimeout)
	}
	for r.inFlight.len() > 0 {
		h, _ := r.inFlight.peek()
		e, _, err := r.lookup(h)
		if err == nil && e.phase == phasePrefilling {
			if e.dispatchAt+r.cfg.FirstTokenTimeoutS > t {
				break
			}
			// The prefill engine stops holding a slot for it: the request counts as decoding
			// (its stream and KV reservation stay on its decode engine until it ends), and it
			// gives no correction samples.
			r.counters.FirstTokenTimeouts++
			r.lastTimeout = e.dispatchAt + r.cfg.FirstTokenTimeoutS
			e.timedOut = true
			r.endPrefill(t, e, false)
		}
		r.inFlight.pop()
	}
	for r.unary.len() > 0 { // non-streaming requests leave prefill at its projected end
		d := r.unary.peek()
		if e, _, err := r.lookup(Handle(d.id)); err == nil && e.phase == phasePrefilling {
			if d.key > t {
				break
			}
			r.endPrefill(t, e, false)
		}
		r.unary.pop()
	}
	r.pump(t)
}

// NextDeadline is the earliest time at which Tick has work: the oldest waiting request's wait
// limit, the oldest prefilling request's first-token limit, or the earliest projected prefill
// end of a non-streaming request. It drops requests that already left those phases from the
// heads of its queues on the way.
func (r *Router) NextDeadline() (time.Time, bool) {
	next := math.Inf(1)
	for r.waiting.len() > 0 {
		h, _ := r.waiting.peek()
		if e, _, err := r.lookup(h); err == nil && e.phase == phaseWaiting {
			next = e.arrival + r.cfg.WaitingSet.MaxWaitS
			break
		}
		r.waiting.pop()
	}
	for r.inFlight.len() > 0 {
		h, _ := r.inFlight.peek()
		if e, _, err := r.lookup(h); err == nil && e.phase == phasePrefilling {
			next = min(next, e.dispatchAt+r.cfg.FirstTokenTimeoutS)
			break
		}
		r.inFlight.pop()
	}
	for r.unary.len() > 0 {
		d := r.unary.peek()
		if e, _, err := r.lookup(Handle(d.id)); err == nil && e.phase == phasePrefilling {
			next = min(next, d.key)
			break
		}
		r.unary.pop()
	}
	if math.IsInf(next, 1) {
		return time.Time{}, false
	}
	return r.Time(next), true
}
