package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Router is the live router as the controller's wrapper uses it (router.Live implements it):
// each evaluation prices a fork of the router taken under its lock (router.Router.Fork), so it
// prices exactly what placement saw at that instant without holding placement up.
type Router interface {
	Do(fn func(now time.Time, r *router.Router))
}

var _ Router = (*router.Live)(nil)

// Observer receives every decision (metrics) once it is applied, logged and listed by Recent;
// nil is allowed.
type Observer interface {
	ObserveDecision(d *decisionlog.Decision, took time.Duration)
}

// Observers hands every decision to each of its observers, in order.
type Observers []Observer

// ObserveDecision hands d to every observer.
func (o Observers) ObserveDecision(d *decisionlog.Decision, took time.Duration) {
	for _, x := range o {
		x.ObserveDecision(d, took)
	}
}

// RecentDecisions is how many decision records Live keeps for /narwhal/state.
const RecentDecisions = 64

// Live runs a Controller in real time, as router.Live runs the router: it serializes calls,
// sleeps until the controller's next deadline (or an urgent trigger), runs each evaluation due
// on a fork of the router copied under the router's lock (placement is not held up while it
// prices), and applies the moves to the fleet, which pushes them to the router and to every
// Envoy. Decisions and fleet events go to the decision log.
type Live struct {
	fleet    *fleet.Fleet
	router   Router
	log      *slog.Logger
	observer Observer
	dlog     *decisionlog.Log
	persist  func(d *decisionlog.Decision, c Durable) error

	triggers *Triggers // handed over without waiting for an evaluation under way

	mu     sync.Mutex
	c      *Controller
	fork   *router.Router // the router as the last evaluation priced it (storage reused)
	recent []decisionlog.Decision
}

// Triggers is the mailbox of urgent-wake triggers between the live router and the live
// controller: the router's hook puts (never waiting: the data path calls it), the controller
// takes. Built before both, so that neither needs the other to exist first.
type Triggers struct {
	queue chan router.Trigger
	kick  chan struct{}
}

// NewTriggers returns an empty mailbox.
func NewTriggers() *Triggers {
	return &Triggers{queue: make(chan router.Trigger, 1024), kick: make(chan struct{}, 1)}
}

// Put hands over a trigger (router.Hooks.Trigger) and wakes the controller. Past 1,024 triggers
// not yet taken, later ones are dropped: they would only have joined the pending evaluation.
func (t *Triggers) Put(tr router.Trigger) {
	select {
	case t.queue <- tr:
	default:
	}
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// LiveOptions configure NewLive.
type LiveOptions struct {
	Fleet    *fleet.Fleet
	Router   Router
	Logger   *slog.Logger
	Observer Observer
	Log      *decisionlog.Log // the decision log; nil writes none
	// Triggers is where the router's urgent triggers arrive (its Hooks.Trigger is Triggers.Put);
	// nil: a mailbox of Live's own (Live.Trigger puts into it).
	Triggers *Triggers
	// Persist, when set, must make each decision durable before it is applied and logged: it
	// gets the decision and the controller's durable state after it (its sequence number among
	// them, so a successor never numbers a decision again), and an error keeps the decision's
	// moves from being applied (the decision is recorded blocked, saying why). Replicas on etcd
	// use it: no role move they cannot persist.
	Persist func(d *decisionlog.Decision, c Durable) error
}

// NewLive wraps c.
func NewLive(c *Controller, o LiveOptions) *Live {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Triggers == nil {
		o.Triggers = NewTriggers()
	}
	return &Live{c: c, fleet: o.Fleet, router: o.Router, log: o.Logger, observer: o.Observer, dlog: o.Log, persist: o.Persist,
		triggers: o.Triggers}
}

// Trigger hands the controller an urgent-wake trigger (Triggers.Put).
func (l *Live) Trigger(tr router.Trigger) { l.triggers.Put(tr) }

// takeTriggers hands the triggers received so far to the controller; l.mu is held.
func (l *Live) takeTriggers() {
	for {
		select {
		case tr := <-l.triggers.queue:
			l.c.Trigger(tr)
		default:
			return
		}
	}
}

// Recent returns the last decision records, oldest first.
func (l *Live) Recent() []decisionlog.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]decisionlog.Decision(nil), l.recent...)
}

// Durable returns the controller's durable state (Controller.Durable) between evaluations, and
// the fleet as those evaluations left it: both read under the lock every decision is applied
// under, so a state written from them never holds a decision's number without its moves, nor
// its moves without its number.
func (l *Live) Durable() (Durable, fleet.Snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.Durable(), l.fleet.Snapshot()
}

// Restore continues from a saved controller state (Controller.Restore), before Run.
func (l *Live) Restore(d Durable) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.c.Restore(d)
}

// Window returns the arrival-evidence window as the last evaluation saw it.
func (l *Live) Window() decisionlog.WindowState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.windowState()
}

// Run evaluates until ctx is done.
func (l *Live) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.evaluateDue()
		l.mu.Lock()
		l.takeTriggers()
		next := l.c.NextDeadline()
		l.mu.Unlock()
		var now time.Time // the router's clock, the one every decision is taken on
		l.router.Do(func(t time.Time, _ *router.Router) { now = t })
		timer.Reset(max(next.Sub(now), time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-l.triggers.kick: // Reset above discards a stale tick (Go 1.23 timers)
		}
	}
}

// Advise evaluates a proposed split as an advisory decision (Controller.Advise) on the live
// router, records it like any decision and returns it.
func (l *Live) Advise(prefill, decode int, reason string) (decisionlog.Decision, error) {
	var d decisionlog.Decision
	var err error
	begin := time.Now()
	l.mu.Lock()
	var now time.Time
	var snap fleet.Snapshot
	l.router.Do(func(t time.Time, r *router.Router) { // as evaluateDue: the fleet the router prices
		now, snap = t, l.fleet.Snapshot()
		r.SetFleet(t, snap)
		l.fork = r.Fork(l.fork)
	})
	d, err = l.c.Advise(now, snap, l.fork, prefill, decode, reason)
	if err == nil {
		d.NotPersisted = l.durable(d) != nil // an advisory decision moves nothing
		l.publish(&d, time.Since(begin))
	}
	l.mu.Unlock()
	return d, err
}

// evaluateDue runs every evaluation due now, applying each one's moves before the next.
func (l *Live) evaluateDue() {
	for {
		var d decisionlog.Decision
		var ok bool
		var took time.Duration
		l.mu.Lock()
		l.takeTriggers()
		var now time.Time
		var snap fleet.Snapshot
		l.router.Do(func(t time.Time, r *router.Router) {
			// The fleet as the controller sees it is the fleet the router prices: taken and
			// applied under the router's lock, so that no change comes between them.
			now, snap = t, l.fleet.Snapshot()
			r.SetFleet(t, snap)
			l.fork = r.Fork(l.fork)
		})
		if !l.c.NextDeadline().After(now) {
			begin := time.Now()
			d, ok = l.c.Tick(now, snap, l.fork)
			took = time.Since(begin)
		}
		if ok { // under l.mu: decisions and their fleet events reach the log in order
			rec := Step(l.c, Edge{Fleet: l.fleet, Prep: livePreparer{l.router}, Persist: l.persist, Log: l.log}, d, now)
			l.publish(&rec, took)
		}
		l.mu.Unlock()
		if !ok {
			return
		}
	}
}

// publish logs a decision, lists it in Recent, and tells the observer; l.mu is held.
func (l *Live) publish(d *decisionlog.Decision, took time.Duration) {
	l.dlog.Decision(d)
	if len(l.recent) == RecentDecisions {
		copy(l.recent, l.recent[1:])
		l.recent = l.recent[:RecentDecisions-1]
	}
	l.recent = append(l.recent, *d)
	// Moves and blocks (advisory ones too) at info; the routine rest (retained, dropped, an
	// advisory pass that would retain) at debug.
	level := slog.LevelDebug
	if d.Outcome == decisionlog.OutcomeMoved || d.Outcome == decisionlog.OutcomeBlocked || d.Outcome == decisionlog.OutcomeAdvisory && d.AdvisoryResult != decisionlog.WouldRetain {
		level = slog.LevelInfo
	}
	l.log.Log(context.Background(), level, "role decision", "seq", d.Seq, "caller", d.Caller, "outcome", d.Outcome, "advisory_result", d.AdvisoryResult, "reason", d.Reason, "moves", d.Moves)
	if l.observer != nil {
		l.observer.ObserveDecision(d, took)
	}
}

// Edge is what taking a decision from proposal to record needs of the process around the
// controller: the fleet the moves go to, the placement side (a donor prepared), and Persist,
// which makes the decision durable before any move (nil: nothing to persist, the simulator).
type Edge struct {
	Fleet   *fleet.Fleet
	Prep    Preparer
	Persist func(d *decisionlog.Decision, c Durable) error
	Log     *slog.Logger // may be nil
}

// Step is the one edge step of a proposed decision, for the live wrapper and the simulator
// alike: persist it, apply its moves to the fleet at now (none when it could not be persisted),
// acknowledge the record of what happened to c (Applied), and return that record, which the
// caller logs. The proposal is not changed.
func Step(c *Controller, e Edge, d decisionlog.Decision, now time.Time) decisionlog.Decision {
	var err error
	if e.Persist != nil {
		err = e.Persist(&d, c.DurableAfter(d))
	}
	if err != nil && len(d.Moves) > 0 {
		if e.Log != nil {
			e.Log.Warn("role move not applied: its state could not be written", "decision", d.Seq, "err", err)
		}
		d = Settled(d, Ack{NotApplied: fmt.Sprintf("the state could not be written (%v)", err)})
	} else if err != nil && e.Log != nil {
		e.Log.Warn("decision not persisted", "decision", d.Seq, "err", err)
	}
	ack := ApplyDecision(e.Fleet, e.Prep, d, now, e.Log)
	ack.NotPersisted = err != nil
	rec := Settled(d, ack)
	c.Applied(rec)
	return rec
}

// Ack is what the edge did with a proposed decision: the moves the fleet refused, none applied
// and why, whether the decision's state was persisted. The proposal stays as the controller
// made it; Settled is the record of what happened, which the log writes and Applied takes.
type Ack struct {
	Refused []Refusal // in the proposal's order
	// NotApplied says why the edge makes none of the moves ("" when it tried them).
	NotApplied   string
	NotPersisted bool
}

// Refusal is a move the fleet refused (an engine an operator pinned in between, say).
type Refusal struct {
	Engine string
	Err    error
}

// Settled is the record of decision d as ack says it went: a decision none of whose moves is
// applied becomes blocked, its split stays where it was; a refused move is left out, the reason
// says why, and the split and outcome say what happened. Acknowledged so (Controller.Applied),
// a move not made leaves the controller's guards as they were.
func Settled(d decisionlog.Decision, ack Ack) decisionlog.Decision {
	d.NotPersisted = d.NotPersisted || ack.NotPersisted
	if ack.NotApplied != "" {
		d.Reason += "; not applied: " + ack.NotApplied
		d.Moves, d.SplitAfter = nil, d.SplitBefore
		if d.Outcome == decisionlog.OutcomeMoved {
			d.Outcome = decisionlog.OutcomeBlocked
		}
		return d
	}
	if len(ack.Refused) == 0 {
		return d
	}
	kept := make([]decisionlog.Move, 0, len(d.Moves))
	for _, m := range d.Moves {
		i := slices.IndexFunc(ack.Refused, func(r Refusal) bool { return r.Engine == m.Engine })
		if i < 0 {
			kept = append(kept, m)
			continue
		}
		d.Reason += fmt.Sprintf("; the fleet refused moving %s: %v", m.Engine, ack.Refused[i].Err)
	}
	if d.Outcome == decisionlog.OutcomeMoved {
		p, q := d.SplitBefore.Prefill, d.SplitBefore.Decode
		for _, m := range kept {
			if m.To == fleet.Prefill {
				p, q = p+1, q-1
			} else {
				p, q = p-1, q+1
			}
		}
		d.SplitAfter = decisionlog.Split{Prefill: p, Decode: q}
		if len(kept) == 0 {
			d.Outcome = decisionlog.OutcomeBlocked
		}
	}
	d.Moves = kept
	return d
}

// durable hands an advisory decision to Persist, if any; l.mu is held (Step does it for the
// others). A failure is logged: the state is written again after the next change.
func (l *Live) durable(d decisionlog.Decision) error {
	if l.persist == nil {
		return nil
	}
	err := l.persist(&d, l.c.DurableAfter(d))
	if err != nil {
		l.log.Warn("decision not persisted", "decision", d.Seq, "err", err)
	}
	return err
}

// Preparer is the placement side of a decision (router.Router implements it): the decode donor
// being prepared, or "" for none (Decision.Prepare).
type Preparer interface {
	Prepare(engine string)
}

var _ Preparer = (*router.Router)(nil)

// livePreparer prepares on the live router, under its lock.
type livePreparer struct{ r Router }

func (p livePreparer) Prepare(engine string) {
	p.r.Do(func(_ time.Time, r *router.Router) { r.Prepare(engine) })
}

// ApplyDecision makes a decision's moves in the fleet at now (the decision's time), and hands
// a regular or urgent evaluation's prepared donor (or none) to placement, as the live wrapper
// and the simulator do. An engine that switches by routing takes its new role at once; one
// that switches in place (switch: sglang) starts its switch (lifecycle switching; a Switcher
// ends it). A move the fleet refuses (an engine an operator pinned in between) is logged and
// acknowledged refused (Settled leaves it out of the record). log may be nil.
func ApplyDecision(f *fleet.Fleet, p Preparer, d decisionlog.Decision, now time.Time, log *slog.Logger) Ack {
	// A regular pass replaces the preparation (one that prepares nothing ends it); an urgent
	// evaluation sets it, or ends it with a move, but one that neither prepares nor moves leaves
	// it alone: it judged only its triggering request, and the urgent wakes between two passes
	// would otherwise cancel the pass's preparation before its donor could drain.
	if d.Caller == decisionlog.CallerRegular || d.Caller == decisionlog.CallerUrgent && (d.Prepare != "" || len(d.Moves) > 0) {
		defer p.Prepare(d.Prepare)
	}
	var ack Ack
	for _, m := range d.Moves {
		if _, err := f.Move(m.Engine, m.To, now, d.Seq); err != nil {
			if log != nil {
				log.Warn("role move refused", "decision", d.Seq, "engine", m.Engine, "err", err)
			}
			ack.Refused = append(ack.Refused, Refusal{m.Engine, err})
		}
	}
	return ack
}
