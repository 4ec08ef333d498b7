package sim

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/enginesim"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Epoch is the virtual time of a replay's start (the trace's second 0).
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// DrainS is how long a replay runs past its last arrival for the requests still in flight;
// those unfinished then count as misses.
const DrainS = 600

// run is one policy's replay of a trace: the real router, fleet and (for the narwhal policy)
// controller, against one enginesim.Model per engine, in event-driven virtual time.
type run struct {
	cfg    *config.Config
	policy Policy
	reqs   []Request
	seed   int64

	f       *fleet.Fleet
	r       *router.Router
	c       *controller.Controller // narwhal only
	planner *planner               // threshold only
	health  *controller.Health
	log     *decisionlog.Log
	logBuf  bytes.Buffer

	engines []*simEngine
	byID    map[string]int
	events  eventHeap
	next    int // the next trace request to arrive
	handles map[router.Handle]int32
	open    int           // requests admitted and not yet finished, failed or turned away
	taken   router.Output // the router's output (settle)
	out     []result
	moves   []roleChange
	// underway counts the in-place switches under way (switch: sglang): started, not ended
	underway int
	now      time.Time
	end      time.Time // arrivals stop (the trace's end or --duration-s)
	faults   []config.Fault
	probeAt  time.Time
	// blockTokens is the size of the prefix blocks hashed for the router's affinity index
	// and the engines' prefix caches (0: the trace's blocks cannot be cut to it).
	blockTokens int
}

// TraceBlockTokens is the size of a trace's prefix blocks.
const TraceBlockTokens = 512

// prefixBlockTokens is the block size prefix hashes are cut to: the router's
// prefix_affinity.block_tokens when it divides the trace's 512-token blocks, else 0.
func prefixBlockTokens(cfg *config.Config) int {
	bt := cfg.Router.PrefixAffinity.BlockTokens
	if bt <= 0 || TraceBlockTokens%bt != 0 {
		return 0
	}
	return bt
}

// prefixHashes are the chained hashes of a request's prefix blocks cut to bt tokens, full
// blocks of its prompt only: equal trace blocks give equal hashes, and each hash stands for
// the whole prefix up to it.
func prefixHashes(q *Request, bt int) []uint64 {
	if bt <= 0 || len(q.PrefixBlocks) == 0 {
		return nil
	}
	per := TraceBlockTokens / bt
	n := min(len(q.PrefixBlocks)*per, q.InputTokens/bt)
	out := make([]uint64, 0, n)
	h := uint64(0x6e617277)
	for i := 0; i < n; i++ {
		h = mix(h ^ (uint64(q.PrefixBlocks[i/per])*uint64(per) + uint64(i%per) + 1))
		out = append(out, h)
	}
	return out
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// simEngine is one engine's model and what the replay knows of it.
type simEngine struct {
	id    string
	idx   int
	m     *enginesim.Model
	up    bool
	next  time.Time // when m needs Advance; zero when idle
	ver   uint64    // the version of its pending step event
	prof  config.Profile
	owner *run
}

// result is what happened to one request of the trace.
type result struct {
	handle    router.Handle
	arrival   time.Time
	first     time.Time // zero until its first token
	done      time.Time // zero until it finished
	generated int
	rejected  bool
	code      router.Code // why it was turned away
	left      time.Time   // when it left the waiting set (placed or turned away)
	failed    bool
	kind      router.Kind
	prefill   int32    // engine index
	decode    int32    // engine index
	onDecode  bool     // the KV reached the decode engine (or, aggregate, it was submitted)
	prefix    []uint64 // its prefix hashes, until its prefill starts
}

// roleChange is one engine changing role.
type roleChange struct {
	at        time.Time
	engine    string
	to        fleet.Role
	residents int // requests on the engine when its role changed
	caller    string
}

func newRun(cfg *config.Config, p Policy, reqs []Request, seed int64, end time.Time) (*run, error) {
	cfg = p.configure(cfg)
	f, err := fleet.New(cfg, Epoch)
	if err != nil {
		return nil, err
	}
	s := &run{cfg: cfg, policy: p, reqs: reqs, seed: seed, f: f, byID: map[string]int{}, handles: map[router.Handle]int32{},
		out: make([]result, len(reqs)), now: Epoch, end: end, health: controller.NewHealth(cfg.Health)}
	s.log = decisionlog.New(&s.logBuf, Epoch, cfg, f.Snapshot())
	f.OnChange(s.fleetEvent)
	s.r = router.New(cfg, f.Snapshot(), Epoch)
	switch p.Kind {
	case PolicyNarwhal:
		s.c = controller.New(cfg, Epoch)
	case PolicyThreshold:
		s.planner = newPlanner(cfg)
	}
	truth := cfg.Sim.Truth
	s.blockTokens = prefixBlockTokens(cfg)
	for i, e := range cfg.Engines {
		prof := cfg.Profiles[e.Profile]
		se := &simEngine{id: e.ID, idx: i, up: true, prof: prof, owner: s}
		mo := enginesim.ModelOptions{NoiseSigma: cfg.Sim.NoiseSigma, Seed: seed}
		if prof.Decode != nil && s.blockTokens > 0 {
			mo.PrefixBlocks, mo.BlockTokens = prof.Decode.MaxKVTokens/s.blockTokens, s.blockTokens
		}
		se.m = enginesim.NewModel(truthProfile(prof, truth), mo, se)
		s.engines = append(s.engines, se)
		s.byID[e.ID] = i
	}
	s.faults = append(s.faults, cfg.Sim.Faults...)
	slices.SortStableFunc(s.faults, func(a, b config.Fault) int { return cmp.Compare(a.AtS, b.AtS) }) // in time order, as listed at one time
	if len(s.faults) > 0 {
		s.probeAt = Epoch
	}
	return s, nil
}

// truthProfile is the engine's true timing: its profile with each phase scaled by sim.truth
// (a scale of 1.5 makes that phase 1.5 times slower than the router believes).
func truthProfile(p config.Profile, t config.Truth) config.Profile {
	if p.Prefill != nil && t.PrefillScale > 0 && t.PrefillScale != 1 {
		c := *p.Prefill
		c.BaseS, c.PerTokenS, c.PerToken2S = c.BaseS*t.PrefillScale, c.PerTokenS*t.PrefillScale, c.PerToken2S*t.PrefillScale
		p.Prefill = &c
	}
	if p.Decode != nil && t.DecodeScale > 0 && t.DecodeScale != 1 {
		c := *p.Decode
		c.BaseS, c.PerStreamS, c.PerKVTokenS = c.BaseS*t.DecodeScale, c.PerStreamS*t.DecodeScale, c.PerKVTokenS*t.DecodeScale
		p.Decode = &c
	}
	return p
}

// Event kinds, in the order events of one instant are handled.
const (
	evFault = iota
	evProbe
	evEngine
	evHandoff
	evArrival
	evRouter
	evController
)

// stuckAfter is how many events one virtual instant may hold before the replay gives up: a
// deadline that a core does not see as reached would otherwise spin for ever.
const stuckAfter = 10_000_000

// loop replays the trace to the end of its drain.
func (s *run) loop(progress func(t float64)) error {
	_, err := s.runUntil(time.Time{}, progress)
	return err
}

// runUntil replays the events before until (the zero time: no bound) and reports whether the
// replay is over: the drain's end passed, or nothing is left to happen. It leaves the replay at
// until when it stops there, so that a change made next happens at that time.
func (s *run) runUntil(until time.Time, progress func(t float64)) (over bool, err error) {
	stop := s.end.Add(DrainS * time.Second)
	lastProgress := s.now.Sub(Epoch).Seconds()
	same := 0
	for {
		at, kind := s.nextEvent()
		if at.After(stop) || kind < 0 {
			return true, nil
		}
		if !until.IsZero() && !at.Before(until) {
			s.now = until
			return false, nil
		}
		if same++; !at.Equal(s.now) {
			same = 0
		} else if same > stuckAfter {
			return true, fmt.Errorf("sim %s: stuck at %.6f s virtual: event kind %d does not advance", s.policy.Name, at.Sub(Epoch).Seconds(), kind)
		}
		if kind == evArrival && at.After(s.end) {
			s.next = len(s.reqs)
			continue
		}
		s.now = at
		switch kind {
		case evFault:
			s.fault(s.faults[0])
			s.faults = s.faults[1:]
		case evProbe:
			s.probe()
		case evEngine:
			ev := s.events.pop()
			if e := s.engines[ev.idx]; ev.ver == e.ver {
				next, busy := e.m.Advance(at)
				s.schedule(e, next, busy)
			}
		case evHandoff:
			ev := s.events.pop()
			s.handoff(int(ev.idx))
		case evArrival:
			s.arrive(s.next)
			s.next++
		case evRouter:
			s.r.Tick(at)
		case evController:
			s.evaluate()
		}
		s.settle()
		if progress != nil && at.Sub(Epoch).Seconds()-lastProgress >= 60 {
			lastProgress = at.Sub(Epoch).Seconds()
			progress(lastProgress)
		}
		if s.next >= len(s.reqs) && s.idle() {
			return true, nil
		}
	}
}

// idle reports that nothing is left to happen but the controller's own passes.
func (s *run) idle() bool {
	return len(s.faults) == 0 && s.open == 0
}

// nextEvent is the earliest pending event and its kind (-1: none).
func (s *run) nextEvent() (time.Time, int) {
	best, kind := time.Time{}, -1
	consider := func(at time.Time, k int) {
		if kind < 0 || at.Before(best) || at.Equal(best) && k < kind {
			best, kind = at, k
		}
	}
	if len(s.faults) > 0 {
		consider(Epoch.Add(config.Seconds(s.faults[0].AtS)), evFault)
	}
	if !s.probeAt.IsZero() {
		consider(s.probeAt, evProbe)
	}
	for s.events.len() > 0 {
		ev := s.events.top()
		if ev.kind == evEngine && s.engines[ev.idx].ver != ev.ver {
			s.events.pop() // superseded
			continue
		}
		consider(Epoch.Add(time.Duration(ev.at)), ev.kind)
		break
	}
	if s.next < len(s.reqs) {
		consider(s.arrivalTime(s.next), evArrival)
	}
	if at, ok := s.r.NextDeadline(); ok {
		consider(maxTime(at, s.now), evRouter)
	}
	if s.c != nil {
		consider(maxTime(s.c.NextDeadline(), s.now), evController)
	} else if s.planner != nil {
		consider(maxTime(s.planner.next, s.now), evController)
	}
	return best, kind
}

func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

func (s *run) arrivalTime(i int) time.Time { return Epoch.Add(config.Seconds(s.reqs[i].ArrivalS)) }

// arrive offers request i to the router.
func (s *run) arrive(i int) {
	q := &s.reqs[i]
	o := &s.out[i]
	o.arrival = s.now
	o.prefix = prefixHashes(q, s.blockTokens)
	out := s.r.Offer(s.now, router.Offer{ID: "r", PromptTokens: max(q.InputTokens, 1), Prefix: o.prefix})
	o.handle = out.Handle
	switch out.Status {
	case router.Rejected:
		o.rejected, o.code, o.left = true, out.Code, s.now
	case router.Waiting:
		s.open++
		s.handles[out.Handle] = int32(i)
	case router.Dispatched:
		s.open++
		s.handles[out.Handle] = int32(i)
		s.dispatch(i, out.Placement)
	}
}

// settle hands out what the router produced: dispatches and rejections of waiting requests,
// urgent triggers, passive-health ejections.
func (s *run) settle() {
	for {
		s.r.Take(&s.taken)
		if s.taken.Urgent && s.c != nil {
			s.c.Trigger(s.taken.Trigger)
		}
		// An ejection changes the fleet, and the router may dispatch on the change: handle
		// what it produces at this same instant.
		ejected := false
		for _, e := range s.taken.Ejections {
			if _, err := s.f.Eject(e.Engine, e.Failures, s.now); err == nil {
				s.syncFleet()
				ejected = true
			}
		}
		if len(s.taken.Outcomes) == 0 && !ejected {
			break
		}
		for _, o := range s.taken.Outcomes {
			i, ok := s.handles[o.Handle]
			if !ok {
				continue
			}
			switch o.Status {
			case router.Dispatched:
				s.dispatch(int(i), o.Placement)
			case router.Rejected:
				s.out[i].rejected, s.out[i].code, s.out[i].left = true, o.Code, s.now
				s.open--
				delete(s.handles, o.Handle)
			}
		}
	}
	s.switches()
}

// switches applies the switcher's steps (controller.SwitchSteps) as controller.Switcher does:
// an engine held for an in-place switch (switch: sglang) is asked once the router shows nothing
// resident on it and (the engine model having no rebuild time) switches at once; one that left
// switching before it was asked has its switch abandoned.
func (s *run) switches() {
	if s.underway == 0 {
		return
	}
	steps := controller.SwitchSteps(s.f.Snapshot(), s.r.Snapshot(s.now).Engines)
	for _, st := range steps {
		if st.Action == controller.SwitchAbandon {
			_, _ = s.f.FinishSwitch(st.Engine, fleet.SwitchAbandoned, s.now, st.Detail)
		} else if _, err := s.f.AskSwitch(st.Engine, s.now, "its residents finished"); err == nil {
			_, _ = s.f.FinishSwitch(st.Engine, fleet.SwitchSucceeded, s.now, "switched (simulated)")
		}
	}
	if len(steps) > 0 {
		s.syncFleet()
	}
}

// dispatch starts a placed request: its prefill on the prefill engine (disaggregated), or
// both phases on one engine (the fallback's aggregate, or a decode engine's local prefill).
func (s *run) dispatch(i int, p router.Placement) {
	o := &s.out[i]
	o.kind, o.left = p.Kind, s.now
	o.prefill, o.decode = int32(s.byID[p.Prefill]), int32(s.byID[p.Decode])
	q := &s.reqs[i]
	prompt, output := max(q.InputTokens, 1), max(q.OutputTokens, 1)
	prefix := o.prefix
	o.prefix = nil
	if p.Kind != router.Disaggregated {
		o.onDecode = true
		s.submit(s.engines[o.prefill], enginesim.Job{ID: uint64(i), Prompt: prompt, Output: output, Prefix: prefix})
		return
	}
	s.submit(s.engines[o.prefill], enginesim.Job{ID: uint64(i), Prompt: prompt, Output: 1, Prefix: prefix})
}

// submit queues a request on engine e; a down engine fails it at once.
func (s *run) submit(e *simEngine, j enginesim.Job) {
	if !e.up {
		s.fail(int(j.ID))
		return
	}
	next, busy := e.m.Submit(s.now, j)
	s.schedule(e, next, busy)
}

// schedule records when e next needs Advance.
func (s *run) schedule(e *simEngine, next time.Time, busy bool) {
	if !busy {
		e.next = time.Time{}
		e.ver++
		return
	}
	if next.Equal(e.next) {
		return
	}
	e.next = next
	e.ver++
	s.events.push(event{at: nanos(next), kind: evEngine, idx: uint32(e.idx), ver: e.ver})
}

// FirstToken implements enginesim.Observer: the client's first token, unless this is the
// prefill engine of a disaggregated request (its single token is the prefill's end).
func (e *simEngine) FirstToken(id uint64, at time.Time) {
	s := e.owner
	o := &s.out[id]
	if !o.onDecode {
		return
	}
	o.first = at
	_ = s.r.FirstToken(at, o.handle)
}

// Finished implements enginesim.Observer.
func (e *simEngine) Finished(id uint64, at time.Time, generated int) {
	s := e.owner
	o := &s.out[id]
	if !o.onDecode { // the prefill of a disaggregated request: the KV moves to the decode engine
		s.events.push(event{at: nanos(at.Add(config.Seconds(e.prof.KVTransferS))), kind: evHandoff, idx: uint32(id)})
		return
	}
	o.done, o.generated = at, generated
	s.open--
	_ = s.r.Complete(at, o.handle, generated)
	delete(s.handles, o.handle)
}

// handoff submits a prefilled request to its decode engine.
func (s *run) handoff(i int) {
	o := &s.out[i]
	if o.failed {
		return
	}
	o.onDecode = true
	q := &s.reqs[i]
	s.submit(s.engines[o.decode], enginesim.Job{ID: uint64(i), Prompt: max(q.InputTokens, 1), Output: max(q.OutputTokens, 1), Prefilled: true})
}

// fail ends request i with an upstream failure.
func (s *run) fail(i int) {
	o := &s.out[i]
	if o.failed || !o.done.IsZero() {
		return
	}
	o.failed = true
	s.open--
	_ = s.r.Fail(s.now, o.handle, router.FailUpstream)
	delete(s.handles, o.handle)
}

// fault applies one scheduled fault.
func (s *run) fault(f config.Fault) {
	i, ok := s.byID[f.Engine]
	if !ok {
		return
	}
	e := s.engines[i]
	switch f.Kind {
	case "fail":
		e.up = false
		for _, id := range e.m.Fail() {
			s.fail(int(id))
		}
		s.schedule(e, time.Time{}, false)
	case "recover":
		e.up = true
	case "drain":
		if _, err := s.f.Drain(f.Engine, s.now, "sim fault", fleet.Floors{}); err == nil {
			s.syncFleet()
		}
	case "undrain":
		if _, err := s.f.Undrain(f.Engine, s.now, "sim fault"); err == nil {
			s.syncFleet()
		}
	}
}

// probe is one health pass: every engine answers its probe when it is up; the health core
// decides the lifecycles.
func (s *run) probe() {
	changed := false
	for _, e := range s.engines {
		before, _ := s.f.Engine(e.id)
		if after, err := controller.Apply(s.health, s.f, s.now, e.id, e.up); err == nil && after != before.Lifecycle {
			changed = true
		}
	}
	if changed {
		s.syncFleet()
	}
	s.probeAt = s.now.Add(config.Seconds(s.cfg.Health.IntervalS))
	if len(s.faults) == 0 && s.allSettled() {
		s.probeAt = time.Time{}
	}
}

// allSettled reports that every engine is up and active: probes have nothing left to find.
func (s *run) allSettled() bool {
	for _, e := range s.f.Snapshot().Engines {
		if e.Lifecycle != fleet.Active && !e.Held {
			return false
		}
	}
	for _, e := range s.engines {
		if !e.up {
			return false
		}
	}
	return true
}

// evaluate runs the controller's (or the planner's) evaluations due now and applies their
// moves through the fleet, as controller.Live does.
func (s *run) evaluate() {
	if s.planner != nil {
		for _, m := range s.planner.evaluate(s.now, s.r, s.f.Snapshot(), s.engines) {
			if _, err := s.f.SetRole(m.Engine, m.to, s.now, "threshold planner"); err == nil {
				s.syncFleet()
			}
		}
		return
	}
	for !s.c.NextDeadline().After(s.now) {
		d, ok := s.c.Tick(s.now, s.f.Snapshot(), s.r)
		if !ok {
			return
		}
		rec := controller.Step(s.c, controller.Edge{Fleet: s.f, Prep: s.r}, d, s.now)
		s.log.Decision(&rec)
		if len(rec.Moves) > 0 {
			s.syncFleet()
		}
	}
}

// fleetEvent logs a fleet event and counts role changes with the residents they leave.
func (s *run) fleetEvent(ev fleet.Event) {
	s.log.Fleet(ev)
	switch {
	case ev.Kind == fleet.EventLifecycle && ev.To == fleet.Switching.String():
		s.underway++
	case ev.Kind == fleet.EventSwitch && ev.Result != fleet.SwitchAsked:
		s.underway--
	}
	if ev.Kind != fleet.EventRole {
		return
	}
	e := s.engines[s.byID[ev.Engine]]
	to, _ := fleet.ParseRole(ev.To)
	s.moves = append(s.moves, roleChange{at: ev.Time, engine: ev.Engine, to: to, residents: e.m.Residents(), caller: ev.Cause})
}

// syncFleet tells the router the fleet changed.
func (s *run) syncFleet() { s.r.SetFleet(s.now, s.f.Snapshot()) }

// nanos is a virtual time as nanoseconds since Epoch (events compare as integers).
func nanos(t time.Time) int64 { return int64(t.Sub(Epoch)) }

// event is a pending engine step end or KV handoff, at nanoseconds since Epoch.
type event struct {
	at   int64
	kind int
	idx  uint32
	ver  uint64
	seq  uint64
}

// eventHeap orders events by time, then kind, then insertion.
type eventHeap struct {
	items []event
	seq   uint64
}

func (h *eventHeap) len() int { return len(h.items) }

func (h *eventHeap) top() *event { return &h.items[0] }

func (h *eventHeap) push(e event) {
	h.seq++
	e.seq = h.seq
	h.items = append(h.items, e)
	it := h.items
	for i := len(it) - 1; i > 0; {
		p := (i - 1) / 2
		if !it[i].less(&it[p]) {
			break
		}
		it[i], it[p] = it[p], it[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	old := h.items
	top := old[0]
	n := len(old) - 1
	old[0] = old[n]
	h.items = old[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && old[l].less(&old[m]) {
			m = l
		}
		if r := l + 1; r < n && old[r].less(&old[m]) {
			m = r
		}
		if m == i {
			break
		}
		old[i], old[m] = old[m], old[i]
		i = m
	}
	return top
}

func (e *event) less(o *event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	if e.kind != o.kind {
		return e.kind < o.kind
	}
	return e.seq < o.seq
}
