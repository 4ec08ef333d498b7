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
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
)

// Rules are the config values the audit checks against (the log's config line, or a config
// file's controller section).
type Rules struct {
	Advisory   bool `json:"advisory"`
	MinPrefill int  `json:"min_prefill"`
	MinDecode  int  `json:"min_decode"`
	Reactive   struct {
		EvidenceSpanS       float64 `json:"evidence_span_s"`
		EvidenceMinArrivals int     `json:"evidence_min_arrivals"`
		EvidenceMaxSpanS    float64 `json:"evidence_max_span_s"`
	} `json:"reactive"`
	Thresholds struct {
		CooldownS float64 `json:"cooldown_s"`
		DwellS    float64 `json:"dwell_s"`
	} `json:"thresholds"`
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

// record is one log line, as much of it as the audit reads.
type record struct {
	Kind       string          `json:"kind"`
	TimeS      float64         `json:"time_s"`
	Controller json.RawMessage `json:"controller"`
	EpochUnixS *float64        `json:"epoch_unix_s"` // the config line: the wall clock at time_s 0
	Event      string          `json:"event"`
	Engines    []struct {
		ID        string `json:"id"`
		Role      string `json:"role"`
		Lifecycle string `json:"lifecycle"`
		Pinned    bool   `json:"pinned"`
	} `json:"engines"`
	Engine   string  `json:"engine"`
	From     string  `json:"from"`
	To       string  `json:"to"`
	Pinned   bool    `json:"pinned"`
	Decision *uint64 `json:"decision"`
	Seq      uint64  `json:"seq"`
	Caller   string  `json:"caller"`
	Switch   string  `json:"switch"` // a decision: how its engines change role (routing, sglang)
	Result   string  `json:"result"` // a switch event: asked, succeeded, failed, abandoned
	Cause    string  `json:"cause"`
	Outcome  string  `json:"outcome"`
	Moves    []struct {
		Engine, From, To string
	} `json:"moves"`
	Inputs struct {
		EvidenceWindow struct {
			OpenedAtS float64 `json:"opened_at_s"`
			Arrivals  uint64  `json:"arrivals"`
		} `json:"evidence_window"`
	} `json:"inputs"`
}

type engine struct {
	role, lifecycle string
	pinned          bool
	roleSince       float64 // -Inf: never moved
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

// Audit reads a decision log and checks it. rules overrides the log's config line when not
// nil. A malformed log is an error naming its line.
func Audit(r io.Reader, rules *Rules) (Result, error) {
	return AuditLogs([]Log{{R: r}}, rules)
}

// entry is one line of one log, its time moved onto the merged clock.
type entry struct {
	log, line int
	rec       record
}

// read parses every line of the logs. With more than one, each log's times are moved onto the
// earliest log's clock (the config lines' epoch_unix_s) and the lines merged in time order;
// within a log they keep their order.
func read(logs []Log) ([]entry, error) {
	var all []entry
	epochs := make([]float64, len(logs))
	for i, l := range logs {
		at := func(line int) string {
			if len(logs) > 1 {
				return fmt.Sprintf("%s: line %d", l.Name, line)
			}
			return fmt.Sprintf("line %d", line)
		}
		sc := bufio.NewScanner(l.R)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		epoch := math.NaN()
		for line := 1; sc.Scan(); line++ {
			var rec record
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				return nil, fmt.Errorf("audit: %s: %w", at(line), err)
			}
			if rec.Kind == "config" && rec.EpochUnixS != nil && math.IsNaN(epoch) {
				epoch = *rec.EpochUnixS
			}
			all = append(all, entry{log: i, line: line, rec: rec})
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("audit: %s: %w", l.Name, err)
		}
		if len(logs) > 1 && math.IsNaN(epoch) {
			return nil, fmt.Errorf("audit: %s: no config line with epoch_unix_s: it cannot be merged with the other logs", l.Name)
		}
		epochs[i] = epoch
	}
	if len(logs) > 1 {
		first := slices.Min(epochs)
		for i := range all {
			off := epochs[all[i].log] - first
			all[i].rec.TimeS += off
			if all[i].rec.Kind == "decision" {
				all[i].rec.Inputs.EvidenceWindow.OpenedAtS += off
			}
		}
		sort.SliceStable(all, func(i, j int) bool { return all[i].rec.TimeS < all[j].rec.TimeS })
	}
	return all, nil
}

// AuditLogs checks several decision logs as one: the logs of the replicas of one fleet (each
// leader writes its own; docs/ha.md), merged on their config lines' wall clock. Their controller
// configs must agree. A later fleet snapshot (a replica's start, or its takeover) re-bases the
// engines it names; an engine whose role it does not change keeps its last role change for
// dwell.
func AuditLogs(logs []Log, rules *Rules) (Result, error) {
	var res Result
	all, err := read(logs)
	if err != nil {
		return res, err
	}
	engines := map[string]*engine{}
	type key struct {
		log int
		seq uint64
	}
	var (
		cfg          Rules
		haveCfg      = rules != nil
		fromLog      bool // cfg is a log's config line
		snapshot     bool
		lastToDecode = math.Inf(-1)
		lastSeq      *entry
		// role events seen per decision, and decisions seen, for the pairing checks
		events    = map[key][]int{}
		decisions = map[key]*record{}
		pending   []pendingEvent
	)
	if rules != nil {
		cfg = *rules
	}
	name := func(log int) string {
		if len(logs) > 1 {
			return logs[log].Name
		}
		return ""
	}
	for _, en := range all {
		res.Lines++
		rec, line := en.rec, en.line
		violate := func(rule, format string, args ...any) {
			res.Violations = append(res.Violations, Violation{Log: name(en.log), Line: line, TimeS: rec.TimeS, Rule: rule, Detail: fmt.Sprintf(format, args...)})
		}
		where := func() string {
			if n := name(en.log); n != "" {
				return fmt.Sprintf("%s: line %d", n, line)
			}
			return fmt.Sprintf("line %d", line)
		}
		switch {
		case rec.Kind == "config":
			var c Rules
			if err := json.Unmarshal(rec.Controller, &c); err != nil {
				return res, fmt.Errorf("audit: %s: controller config: %w", where(), err)
			}
			switch {
			case !haveCfg:
				cfg, haveCfg, fromLog = c, true, true
			case fromLog && c != cfg:
				return res, fmt.Errorf("audit: %s: its controller config differs from the first log's: the logs are not of one fleet", where())
			}
		case rec.Kind == "fleet" && rec.Event == "snapshot":
			for _, e := range rec.Engines {
				since := math.Inf(-1)
				if old := engines[e.ID]; old != nil && old.role == e.Role {
					since = old.roleSince
				}
				engines[e.ID] = &engine{role: e.Role, lifecycle: e.Lifecycle, pinned: e.Pinned, roleSince: since}
			}
			snapshot = true
		case rec.Kind == "fleet" && !snapshot:
			return res, fmt.Errorf("audit: %s: a fleet event before the fleet snapshot", where())
		case rec.Kind == "fleet" && rec.Event == "added":
			if engines[rec.Engine] != nil {
				return res, fmt.Errorf("audit: %s: engine %q added twice", where(), rec.Engine)
			}
			engines[rec.Engine] = &engine{role: rec.To, lifecycle: "recovering", roleSince: math.Inf(-1)}
		case rec.Kind == "fleet" && rec.Event == "removed":
			if engines[rec.Engine] == nil {
				return res, fmt.Errorf("audit: %s: unknown engine %q removed", where(), rec.Engine)
			}
			delete(engines, rec.Engine)
		case rec.Kind == "fleet":
			e := engines[rec.Engine]
			if e == nil {
				return res, fmt.Errorf("audit: %s: unknown engine %q", where(), rec.Engine)
			}
			viaSwitch := e.switchedToRole
			e.switchedToRole = false
			switch rec.Event {
			case "lifecycle":
				if e.failedAt > 0 && rec.To != "failed" {
					violate("switch", "%s became %s after its switch failed (line %d): a failed switch fails its engine", rec.Engine, rec.To, e.failedAt)
				}
				e.failedAt = 0
				if rec.From == "active" && rec.To == "switching" {
					// The engine leaves its pool now: the floor of the pool it leaves holds then.
					e.lifecycle = rec.To
					if total := live(engines, "prefill") + live(engines, "decode") + 1; total >= cfg.MinPrefill+cfg.MinDecode {
						floor := map[string]int{"prefill": cfg.MinPrefill, "decode": cfg.MinDecode}[e.role]
						if n := live(engines, e.role); n < floor {
							violate("role_floors", "%s left %s to switch in place: %d live %s engines, floor %d, with %d live engines", rec.Engine, e.role, n, e.role, floor, total)
						}
					}
				}
				e.lifecycle = rec.To
			case "switch":
				switch rec.Result {
				case "asked":
					if e.asked || e.lifecycle != "switching" {
						violate("switch", "%s asked to switch while %s (asked before: %t): an engine is asked once, while held", rec.Engine, e.lifecycle, e.asked)
					}
					e.asked = true
				case "succeeded":
					e.asked, e.switchedToRole = false, true
				case "failed":
					if e.lifecycle == "switching" {
						e.failedAt = line
					}
					e.asked = false
				case "abandoned":
					if e.asked {
						violate("switch", "%s's switch abandoned after it was asked: an asked switch ends with the engine's answer", rec.Engine)
					}
				}
			case "pin":
				e.pinned = rec.Pinned
			case "role":
				res.RoleChanges++
				if rec.Caller == "operator" {
					// An operator relabelled the engine at its source: not the controller's move,
					// so no guard of the controller's applies; dwell counts from it.
					res.OperatorMoves++
					e.role, e.roleSince = rec.To, rec.TimeS
					continue
				}
				if e.pinned {
					violate("pins", "%s moved %s -> %s while pinned", rec.Engine, rec.From, rec.To)
				}
				if since := rec.TimeS - e.roleSince; since < cfg.Thresholds.DwellS {
					violate("dwell", "%s moved %.3fs after its last role change (dwell %gs)", rec.Engine, since, cfg.Thresholds.DwellS)
				}
				if cfg.Advisory {
					violate("advisory", "%s moved %s -> %s with controller.advisory on", rec.Engine, rec.From, rec.To)
				}
				e.role, e.roleSince = rec.To, rec.TimeS
				if total := live(engines, "prefill") + live(engines, "decode"); total >= cfg.MinPrefill+cfg.MinDecode {
					if p := live(engines, "prefill"); rec.From == "prefill" && p < cfg.MinPrefill {
						violate("role_floors", "%s left prefill: %d live prefill engines, min_prefill %d, with %d live engines", rec.Engine, p, cfg.MinPrefill, total)
					}
					if d := live(engines, "decode"); rec.From == "decode" && d < cfg.MinDecode {
						violate("role_floors", "%s left decode: %d live decode engines, min_decode %d, with %d live engines", rec.Engine, d, cfg.MinDecode, total)
					}
				}
				if rec.Decision == nil {
					violate("orphan_role_change", "%s moved %s -> %s naming no decision", rec.Engine, rec.From, rec.To)
					continue
				}
				k := key{en.log, *rec.Decision}
				events[k] = append(events[k], line)
				pending = append(pending, pendingEvent{log: en.log, line: line, t: rec.TimeS, seq: *rec.Decision, engine: rec.Engine, from: rec.From, to: rec.To, viaSwitch: viaSwitch})
				if e.lifecycle == "switching" && !viaSwitch {
					violate("switch", "%s changed role while held for a switch, not by a successful switch", rec.Engine)
				}
			}
		case rec.Kind == "decision":
			res.Decisions++
			d := rec
			decisions[key{en.log, rec.Seq}] = &d
			if lastSeq != nil && rec.Seq <= lastSeq.rec.Seq {
				violate("sequence", "decision %d follows decision %d (%s): a decision numbered again", rec.Seq, lastSeq.rec.Seq, name(lastSeq.log)+fmt.Sprintf(" line %d", lastSeq.line))
			}
			lastSeq = &en
			toDecode, toPrefill := 0, 0
			for _, m := range rec.Moves {
				if m.To == "decode" {
					toDecode++
				} else {
					toPrefill++
				}
			}
			if n := len(rec.Moves); n > 1 && rec.Caller != "repair" {
				violate("one_move", "decision %d (%s) made %d moves", rec.Seq, rec.Caller, n)
			}
			if n := len(events[key{en.log, rec.Seq}]); n > 1 && rec.Caller != "repair" {
				violate("one_move", "decision %d (%s) has %d role changes", rec.Seq, rec.Caller, n)
			}
			if toDecode > 0 {
				if rec.Caller != "repair" && rec.Caller != "readmission" && rec.TimeS-lastToDecode < cfg.Thresholds.CooldownS {
					violate("cooldown", "decision %d moved toward decode %.3fs after the last move toward decode (cooldown %gs)", rec.Seq, rec.TimeS-lastToDecode, cfg.Thresholds.CooldownS)
				}
				lastToDecode = rec.TimeS
			}
			if toPrefill > 0 && (rec.Caller == "regular" || rec.Caller == "urgent") {
				w := rec.Inputs.EvidenceWindow
				open := rec.TimeS - w.OpenedAtS
				closed := open >= cfg.Reactive.EvidenceSpanS && w.Arrivals >= uint64(cfg.Reactive.EvidenceMinArrivals) || open >= cfg.Reactive.EvidenceMaxSpanS
				switch {
				case w.OpenedAtS < lastToDecode:
					violate("evidence_window", "decision %d: its window opened at %.3fs, before the last move toward decode restarted it", rec.Seq, w.OpenedAtS)
				case !closed:
					violate("evidence_window", "decision %d moved toward prefill with the window open: opened %.3fs ago, %d arrivals (span %gs, min %d, max %gs)",
						rec.Seq, open, w.Arrivals, cfg.Reactive.EvidenceSpanS, cfg.Reactive.EvidenceMinArrivals, cfg.Reactive.EvidenceMaxSpanS)
				}
			}
		}
	}
	if !haveCfg || !snapshot {
		return res, fmt.Errorf("audit: the log has no config line or no fleet snapshot")
	}
	for _, ev := range pending { // every role change is a move of the decision it names, in its log
		d := decisions[key{ev.log, ev.seq}]
		found := false
		if d != nil {
			for _, m := range d.Moves {
				found = found || m.Engine == ev.engine && m.From == ev.from && m.To == ev.to
			}
		}
		if !found {
			res.Violations = append(res.Violations, Violation{Log: name(ev.log), Line: ev.line, TimeS: ev.t, Rule: "orphan_role_change",
				Detail: fmt.Sprintf("%s moved %s -> %s for decision %d, which has no such move", ev.engine, ev.from, ev.to, ev.seq)})
			continue
		}
		if inPlace := d.Switch == "sglang"; inPlace != ev.viaSwitch {
			how := map[bool]string{true: "a successful in-place switch", false: "routing alone"}
			res.Violations = append(res.Violations, Violation{Log: name(ev.log), Line: ev.line, TimeS: ev.t, Rule: "switch",
				Detail: fmt.Sprintf("%s moved %s -> %s by %s for decision %d, whose switch is %q", ev.engine, ev.from, ev.to, how[ev.viaSwitch], ev.seq, d.Switch)})
		}
	}
	sort.SliceStable(res.Violations, func(i, j int) bool {
		a, b := res.Violations[i], res.Violations[j]
		if a.TimeS != b.TimeS {
			return a.TimeS < b.TimeS
		}
		return a.Line < b.Line
	})
	return res, nil
}

// live counts the active engines in role.
func live(engines map[string]*engine, role string) (n int) {
	for _, e := range engines {
		if e.role == role && e.lifecycle == "active" {
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
	from, to  string
	viaSwitch bool // made by the successful switch just before it
}
