// Package audit re-checks a decision log (docs/role-control.md, section 10) without the
// controller's code: it replays the fleet from the log's snapshot and events and reports
// every move that broke a rule — a pinned engine moved, a floor broken while capacity allowed
// it, dwell or the cooldown between moves toward decode broken, more than one move in a
// regular pass or urgent wake, a move toward prefill while the arrival-evidence window was open,
// a role change in advisory mode, a role change without its decision, a decision numbered again,
// and, for engines that switch role in place (docs/role-control.md section 11), a switch asked
// twice or of an engine not held, a role change that no successful switch made (or a switch that
// made one for a decision that switches by routing), a failed switch that did not fail its
// engine.
// Several logs (the replicas of one fleet, each writing its own) are audited as one: their lines
// merged on the wall clock each log's config line carries.
package audit

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
)

// rules are the config values the audit checks against (the log's config line, or a config
// file's controller section), comparable: the logs of one fleet must agree on them.
type rules struct {
	advisory                    bool
	minPrefill, minDecode       int
	evidenceSpanS, evidenceMaxS float64
	evidenceMinArrivals         int
	cooldownS, dwellS           float64
}

func rulesOf(c *config.Controller) rules {
	return rules{advisory: c.Advisory, minPrefill: c.MinPrefill, minDecode: c.MinDecode,
		evidenceSpanS: c.Reactive.EvidenceSpanS, evidenceMaxS: c.Reactive.EvidenceMaxSpanS, evidenceMinArrivals: c.Reactive.EvidenceMinArrivals,
		cooldownS: c.Thresholds.CooldownS, dwellS: c.Thresholds.DwellS}
}

// floor is role's floor (min_prefill, min_decode).
func (r *rules) floor(role fleet.Role) int {
	if role == fleet.Prefill {
		return r.minPrefill
	}
	return r.minDecode
}

// Violation is one broken rule, at the log line that shows it.
type Violation struct {
	Log    string // the log's name when several are audited as one
	Line   int
	TimeS  float64 // seconds since the (earliest) log's start
	Rule   string  // pins, role_floors, dwell, cooldown, one_move, evidence_window, advisory, orphan_role_change, sequence, switch
	Detail string
}

func (v Violation) String() string {
	at := fmt.Sprintf("line %d", v.Line)
	if v.Log != "" {
		at = v.Log + " " + at
	}
	return fmt.Sprintf("%s (%.3fs): %s: %s", at, v.TimeS, v.Rule, v.Detail)
}

// Log is one decision log to audit with others, and the name that violations give it.
type Log struct {
	Name string
	R    io.Reader
}

type engine struct {
	role      fleet.Role
	lifecycle fleet.Lifecycle
	pinned    bool
	roleSince float64 // -Inf: never moved
	// an in-place switch: asked (and not ended), the line of a failed one whose engine must fail
	// next, and whether the last event was a successful switch (the role change it makes)
	asked          bool
	failedAt       int
	switchedToRole bool
}

// Result is what an audit found.
type Result struct {
	Lines, Decisions, RoleChanges int
	// OperatorMoves are the role changes an operator made at an engine's source (a relabel):
	// counted in RoleChanges, checked against none of the controller's guards.
	OperatorMoves int
	Violations    []Violation
}

// Audit reads a decision log and checks it. ctl overrides the log's config line when not
// nil. A malformed log is an error naming its line.
func Audit(r io.Reader, ctl *config.Controller) (Result, error) {
	return AuditLogs([]Log{{R: r}}, ctl)
}

// entry is one line of one log, its times moved onto the merged clock.
type entry struct {
	log int
	decisionlog.Line
}

// read parses every line of the logs. With more than one, each log's times are moved onto the
// earliest log's clock (the config lines' epoch_unix_s) and the lines merged in time order;
// within a log they keep their order.
func read(logs []Log) ([]entry, error) {
	var all []entry
	epochs := make([]float64, len(logs))
	for i, l := range logs {
		epoch := math.NaN()
		err := decisionlog.Read(l.R, func(line decisionlog.Line) error {
			if c := line.Config; c != nil && c.EpochUnixS != nil && math.IsNaN(epoch) {
				epoch = *c.EpochUnixS
			}
			line.Raw = nil
			all = append(all, entry{log: i, Line: line})
			return nil
		})
		if err != nil && len(logs) > 1 {
			return nil, fmt.Errorf("audit: %s: %w", l.Name, err)
		} else if err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		if len(logs) > 1 && math.IsNaN(epoch) {
			return nil, fmt.Errorf("audit: %s: no config line with epoch_unix_s: it cannot be merged with the other logs", l.Name)
		}
		epochs[i] = epoch
	}
	if len(logs) > 1 {
		first := slices.Min(epochs)
		for i := range all {
			shift(&all[i].Line, epochs[all[i].log]-first)
		}
		sort.SliceStable(all, func(i, j int) bool { return all[i].TimeS() < all[j].TimeS() })
	}
	return all, nil
}

// shift moves a line's times by off seconds.
func shift(l *decisionlog.Line, off float64) {
	switch {
	case l.Config != nil:
		l.Config.TimeS += off
	case l.Fleet != nil:
		l.Fleet.TimeS += off
	default:
		l.Decision.TimeS += off
		l.Decision.Inputs.EvidenceWindow.OpenedAtS += off
	}
}

// AuditLogs checks several decision logs as one: the logs of the replicas of one fleet (each
// leader writes its own; docs/ha.md), merged on their config lines' wall clock. Their controller
// configs must agree. A later fleet snapshot (a replica's start, or its takeover) re-bases the
// engines it names; an engine whose role it does not change keeps its last role change for
// dwell.
func AuditLogs(logs []Log, ctl *config.Controller) (Result, error) {
	a := &auditor{logs: logs, engines: map[string]*engine{}, lastToDecode: math.Inf(-1),
		events: map[decisionKey][]int{}, decisions: map[decisionKey]*decisionlog.Decision{}, haveCfg: ctl != nil}
	if ctl != nil {
		a.cfg = rulesOf(ctl)
	}
	all, err := read(logs)
	if err != nil {
		return a.res, err
	}
	for _, en := range all {
		a.res.Lines++
		a.en = en
		if err := a.record(); err != nil {
			return a.res, err
		}
	}
	if !a.haveCfg || !a.snapshot {
		return a.res, fmt.Errorf("audit: the log has no config line or no fleet snapshot")
	}
	a.pair()
	sort.SliceStable(a.res.Violations, func(i, j int) bool {
		x, y := a.res.Violations[i], a.res.Violations[j]
		if x.TimeS != y.TimeS {
			return x.TimeS < y.TimeS
		}
		return x.Line < y.Line
	})
	return a.res, nil
}

// auditor replays merged log lines, one record at a time, and keeps what the rules need: the
// engines as the log describes them, the controller config, the last move toward decode and the
// last decision, and the role changes still to pair with their decisions.
type auditor struct {
	logs    []Log
	res     Result
	en      entry // the line being read
	engines map[string]*engine

	cfg      rules
	haveCfg  bool
	fromLog  bool // cfg is a log's config line
	snapshot bool // a fleet snapshot has been read

	lastToDecode float64
	lastSeq      *entry // the last decision made durable (not not_persisted)
	// role events seen per decision, and decisions seen, for the pairing checks
	events    map[decisionKey][]int
	decisions map[decisionKey]*decisionlog.Decision
	pending   []pendingEvent
}

// decisionKey is a decision of one log.
type decisionKey struct {
	log int
	seq uint64
}

// name is a log's name in messages ("" for a single log).
func (a *auditor) name(log int) string {
	if len(a.logs) > 1 {
		return a.logs[log].Name
	}
	return ""
}

// where is the current line, for errors.
func (a *auditor) where() string {
	if n := a.name(a.en.log); n != "" {
		return fmt.Sprintf("%s: line %d", n, a.en.Num)
	}
	return fmt.Sprintf("line %d", a.en.Num)
}

// violate records a violation of rule at the current line.
func (a *auditor) violate(rule, format string, args ...any) {
	a.res.Violations = append(a.res.Violations, Violation{Log: a.name(a.en.log), Line: a.en.Num, TimeS: a.en.TimeS(), Rule: rule, Detail: fmt.Sprintf(format, args...)})
}

// record reads the current line by its kind.
func (a *auditor) record() error {
	rec := a.en.Fleet
	switch {
	case a.en.Config != nil:
		return a.config()
	case a.en.Decision != nil:
		a.decision()
	case rec.Event == decisionlog.Snapshot:
		a.fleetSnapshot()
	case !a.snapshot:
		return fmt.Errorf("audit: %s: a fleet event before the fleet snapshot", a.where())
	case rec.Event == fleet.EventAdded:
		if a.engines[rec.Engine] != nil {
			return fmt.Errorf("audit: %s: engine %q added twice", a.where(), rec.Engine)
		}
		role, err := fleet.ParseRole(rec.To)
		if err != nil {
			return fmt.Errorf("audit: %s: engine %q added: %w", a.where(), rec.Engine, err)
		}
		a.engines[rec.Engine] = &engine{role: role, lifecycle: fleet.Recovering, roleSince: math.Inf(-1)}
	case rec.Event == fleet.EventRemoved:
		if a.engines[rec.Engine] == nil {
			return fmt.Errorf("audit: %s: unknown engine %q removed", a.where(), rec.Engine)
		}
		delete(a.engines, rec.Engine)
	default:
		return a.fleetEvent()
	}
	return nil
}

// config takes the controller config of a config line: the first log's, unless one was given;
// the other logs' must agree with it.
func (a *auditor) config() error {
	c := rulesOf(&a.en.Config.Controller)
	switch {
	case !a.haveCfg:
		a.cfg, a.haveCfg, a.fromLog = c, true, true
	case a.fromLog && c != a.cfg:
		return fmt.Errorf("audit: %s: its controller config differs from the first log's: the logs are not of one fleet", a.where())
	}
	return nil
}

// fleetSnapshot re-bases the engines it names; one whose role it leaves unchanged keeps its last
// role change (dwell holds across a takeover).
func (a *auditor) fleetSnapshot() {
	for _, e := range a.en.Fleet.Engines {
		since := math.Inf(-1)
		if old := a.engines[e.ID]; old != nil && old.role == e.Role {
			since = old.roleSince
		}
		a.engines[e.ID] = &engine{role: e.Role, lifecycle: e.Lifecycle, pinned: e.Pinned, roleSince: since}
	}
	a.snapshot = true
}

// fleetEvent applies an event of one engine: lifecycle, switch step, pin, role.
func (a *auditor) fleetEvent() error {
	rec := a.en.Fleet
	e := a.engines[rec.Engine]
	if e == nil {
		return fmt.Errorf("audit: %s: unknown engine %q", a.where(), rec.Engine)
	}
	viaSwitch := e.switchedToRole
	e.switchedToRole = false
	switch rec.Event {
	case fleet.EventLifecycle:
		from, errFrom := fleet.ParseLifecycle(rec.From)
		to, errTo := fleet.ParseLifecycle(rec.To)
		if err := errors.Join(errFrom, errTo); err != nil {
			return fmt.Errorf("audit: %s: %w", a.where(), err)
		}
		a.lifecycle(e, from, to)
	case fleet.EventSwitch:
		a.switchStep(e)
	case fleet.EventPin:
		e.pinned = rec.Pinned != nil && *rec.Pinned
	case fleet.EventRole:
		from, errFrom := fleet.ParseRole(rec.From)
		to, errTo := fleet.ParseRole(rec.To)
		if err := errors.Join(errFrom, errTo); err != nil {
			return fmt.Errorf("audit: %s: %w", a.where(), err)
		}
		a.role(e, from, to, viaSwitch)
	}
	return nil
}

// lifecycle checks a lifecycle change: a failed switch fails its engine next, and an engine
// held for an in-place switch leaves its pool then (the floor of that pool holds).
func (a *auditor) lifecycle(e *engine, from, to fleet.Lifecycle) {
	rec := a.en.Fleet
	if e.failedAt > 0 && to != fleet.Failed {
		a.violate("switch", "%s became %s after its switch failed (line %d): a failed switch fails its engine", rec.Engine, to, e.failedAt)
	}
	e.failedAt = 0
	if from == fleet.Active && to == fleet.Switching {
		e.lifecycle = to
		if total := live(a.engines, fleet.Prefill) + live(a.engines, fleet.Decode) + 1; total >= a.cfg.minPrefill+a.cfg.minDecode {
			if n, floor := live(a.engines, e.role), a.cfg.floor(e.role); n < floor {
				a.violate("role_floors", "%s left %s to switch in place: %d live %s engines, floor %d, with %d live engines", rec.Engine, e.role, n, e.role, floor, total)
			}
		}
	}
	e.lifecycle = to
}

// switchStep follows an in-place switch: asked once while held, ended by the engine's answer.
func (a *auditor) switchStep(e *engine) {
	rec := a.en.Fleet
	switch rec.Result {
	case fleet.SwitchAsked:
		if e.asked || e.lifecycle != fleet.Switching {
			a.violate("switch", "%s asked to switch while %s (asked before: %t): an engine is asked once, while held", rec.Engine, e.lifecycle, e.asked)
		}
		e.asked = true
	case fleet.SwitchSucceeded:
		e.asked, e.switchedToRole = false, true
	case fleet.SwitchFailed:
		if e.lifecycle == fleet.Switching {
			e.failedAt = a.en.Num
		}
		e.asked = false
	case fleet.SwitchAbandoned:
		if e.asked {
			a.violate("switch", "%s's switch abandoned after it was asked: an asked switch ends with the engine's answer", rec.Engine)
		}
	}
}

// role checks a role change against pins, dwell, advisory mode and the floors, and keeps it to
// pair with the decision it names. An operator's relabel at the engine's source is not the
// controller's move: no guard applies, and dwell counts from it.
func (a *auditor) role(e *engine, from, to fleet.Role, viaSwitch bool) {
	rec := a.en.Fleet
	a.res.RoleChanges++
	if rec.Caller == decisionlog.CallerOperator {
		a.res.OperatorMoves++
		e.role, e.roleSince = to, rec.TimeS
		return
	}
	cfg := &a.cfg
	if e.pinned {
		a.violate("pins", "%s moved %s -> %s while pinned", rec.Engine, rec.From, rec.To)
	}
	if since := rec.TimeS - e.roleSince; since < cfg.dwellS {
		a.violate("dwell", "%s moved %.3fs after its last role change (dwell %gs)", rec.Engine, since, cfg.dwellS)
	}
	if cfg.advisory {
		a.violate("advisory", "%s moved %s -> %s with controller.advisory on", rec.Engine, rec.From, rec.To)
	}
	e.role, e.roleSince = to, rec.TimeS
	if total := live(a.engines, fleet.Prefill) + live(a.engines, fleet.Decode); total >= cfg.minPrefill+cfg.minDecode {
		if p := live(a.engines, fleet.Prefill); from == fleet.Prefill && p < cfg.minPrefill {
			a.violate("role_floors", "%s left prefill: %d live prefill engines, min_prefill %d, with %d live engines", rec.Engine, p, cfg.minPrefill, total)
		}
		if d := live(a.engines, fleet.Decode); from == fleet.Decode && d < cfg.minDecode {
			a.violate("role_floors", "%s left decode: %d live decode engines, min_decode %d, with %d live engines", rec.Engine, d, cfg.minDecode, total)
		}
	}
	if rec.Decision == 0 {
		a.violate("orphan_role_change", "%s moved %s -> %s naming no decision", rec.Engine, rec.From, rec.To)
		return
	}
	k := decisionKey{a.en.log, rec.Decision}
	a.events[k] = append(a.events[k], a.en.Num)
	a.pending = append(a.pending, pendingEvent{log: a.en.log, line: a.en.Num, t: rec.TimeS, seq: rec.Decision, engine: rec.Engine, from: from, to: to, viaSwitch: viaSwitch})
	if e.lifecycle == fleet.Switching && !viaSwitch {
		a.violate("switch", "%s changed role while held for a switch, not by a successful switch", rec.Engine)
	}
}

// decision checks a decision record: numbered above the last, one move (repairs excepted), the
// cooldown between moves toward decode, and a closed evidence window for a move toward prefill.
func (a *auditor) decision() {
	rec := a.en.Decision
	cfg := &a.cfg
	a.res.Decisions++
	a.decisions[decisionKey{a.en.log, rec.Seq}] = rec
	if a.lastSeq != nil && rec.Seq <= a.lastSeq.Decision.Seq {
		a.violate("sequence", "decision %d follows decision %d (%s): a decision numbered again", rec.Seq, a.lastSeq.Decision.Seq, a.name(a.lastSeq.log)+fmt.Sprintf(" line %d", a.lastSeq.Num))
	}
	if !rec.NotPersisted { // a number never made durable may be given again by a successor
		last := a.en
		a.lastSeq = &last
	}
	toDecode, toPrefill := 0, 0
	for _, m := range rec.Moves {
		if m.To == fleet.Decode {
			toDecode++
		} else {
			toPrefill++
		}
	}
	if n := len(rec.Moves); n > 1 && rec.Caller != decisionlog.CallerRepair {
		a.violate("one_move", "decision %d (%s) made %d moves", rec.Seq, rec.Caller, n)
	}
	if n := len(a.events[decisionKey{a.en.log, rec.Seq}]); n > 1 && rec.Caller != decisionlog.CallerRepair {
		a.violate("one_move", "decision %d (%s) has %d role changes", rec.Seq, rec.Caller, n)
	}
	if toDecode > 0 {
		if rec.Caller != decisionlog.CallerRepair && rec.Caller != decisionlog.CallerReadmission && rec.TimeS-a.lastToDecode < cfg.cooldownS {
			a.violate("cooldown", "decision %d moved toward decode %.3fs after the last move toward decode (cooldown %gs)", rec.Seq, rec.TimeS-a.lastToDecode, cfg.cooldownS)
		}
		a.lastToDecode = rec.TimeS
	}
	if toPrefill > 0 && (rec.Caller == decisionlog.CallerRegular || rec.Caller == decisionlog.CallerUrgent) {
		w := rec.Inputs.EvidenceWindow
		open := rec.TimeS - w.OpenedAtS
		// Evidence in proportion to the prefill pressure (the current split's ttft_ratio): 4/(r−1)²
		// arrivals, at most evidence_min_arrivals (docs/role-control.md section 7).
		need := float64(cfg.evidenceMinArrivals)
		for _, c := range rec.Candidates {
			if r := float64(c.TTFTRatio); c.Current && r > 1 {
				need = min(need, math.Ceil(4/((r-1)*(r-1))))
			}
		}
		closed := open >= cfg.evidenceSpanS && float64(w.Arrivals) >= need || open >= cfg.evidenceMaxS
		switch {
		case w.OpenedAtS < a.lastToDecode:
			a.violate("evidence_window", "decision %d: its window opened at %.3fs, before the last move toward decode restarted it", rec.Seq, w.OpenedAtS)
		case !closed:
			a.violate("evidence_window", "decision %d moved toward prefill with the window open: opened %.3fs ago, %d arrivals (span %gs, need %.0f of min %d, max %gs)",
				rec.Seq, open, w.Arrivals, cfg.evidenceSpanS, need, cfg.evidenceMinArrivals, cfg.evidenceMaxS)
		}
	}
}

// pair checks that every role change is a move of the decision it names, in its log, made the
// way that decision says (routing alone, or a successful in-place switch).
func (a *auditor) pair() {
	for _, ev := range a.pending {
		d := a.decisions[decisionKey{ev.log, ev.seq}]
		found := false
		if d != nil {
			for _, m := range d.Moves {
				found = found || m.Engine == ev.engine && m.From == ev.from && m.To == ev.to
			}
		}
		if !found {
			a.res.Violations = append(a.res.Violations, Violation{Log: a.name(ev.log), Line: ev.line, TimeS: ev.t, Rule: "orphan_role_change",
				Detail: fmt.Sprintf("%s moved %s -> %s for decision %d, which has no such move", ev.engine, ev.from, ev.to, ev.seq)})
			continue
		}
		if inPlace := d.Switch == config.SwitchSGLang; inPlace != ev.viaSwitch {
			how := map[bool]string{true: "a successful in-place switch", false: "routing alone"}
			a.res.Violations = append(a.res.Violations, Violation{Log: a.name(ev.log), Line: ev.line, TimeS: ev.t, Rule: "switch",
				Detail: fmt.Sprintf("%s moved %s -> %s by %s for decision %d, whose switch is %q", ev.engine, ev.from, ev.to, how[ev.viaSwitch], ev.seq, d.Switch)})
		}
	}
}

// live counts the active engines in role.
func live(engines map[string]*engine, role fleet.Role) (n int) {
	for _, e := range engines {
		if e.role == role && e.lifecycle == fleet.Active {
			n++
		}
	}
	return n
}

type pendingEvent struct {
	log, line int
	t         float64
	seq       uint64
	engine    string
	from, to  fleet.Role
	viaSwitch bool // made by the successful switch just before it
}
