// Package audit re-checks a decision log (docs/role-control.md, section 10) without the
// controller's code: it replays the fleet from the log's snapshot and events and reports
// every move that broke a rule — a pinned engine moved, a floor broken while capacity allowed
// it, dwell or the cooldown between moves toward decode broken, more than one move in a
// regular pass or urgent wake, a move toward prefill while the arrival-evidence window was open,
// a role change in advisory mode, a role change without its decision.
package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
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
	Line   int
	TimeS  float64
	Rule   string // pins, role_floors, dwell, cooldown, one_move, evidence_window, advisory, orphan_role_change
	Detail string
}

func (v Violation) String() string {
	return fmt.Sprintf("line %d (%.3fs): %s: %s", v.Line, v.TimeS, v.Rule, v.Detail)
}

// record is one log line, as much of it as the audit reads.
type record struct {
	Kind       string          `json:"kind"`
	TimeS      float64         `json:"time_s"`
	Controller json.RawMessage `json:"controller"`
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
}

// Result is what an audit found.
type Result struct {
	Lines, Decisions, RoleChanges int
	Violations                    []Violation
}

// Audit reads a decision log and checks it. rules overrides the log's config line when not
// nil. A malformed log is an error naming its line.
func Audit(r io.Reader, rules *Rules) (Result, error) {
	var res Result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	engines := map[string]*engine{}
	var (
		cfg          Rules
		haveCfg      = rules != nil
		snapshot     bool
		lastToDecode = math.Inf(-1)
		// role events seen per decision, and decisions seen, for the pairing checks
		events    = map[uint64][]int{}
		decisions = map[uint64]*record{}
		pending   []pendingEvent
	)
	if rules != nil {
		cfg = *rules
	}
	violate := func(line int, t float64, rule, format string, args ...any) {
		res.Violations = append(res.Violations, Violation{Line: line, TimeS: t, Rule: rule, Detail: fmt.Sprintf(format, args...)})
	}
	live := func(role string) (n int) {
		for _, e := range engines {
			if e.role == role && e.lifecycle == "active" {
				n++
			}
		}
		return n
	}
	for line := 1; sc.Scan(); line++ {
		res.Lines++
		var rec record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return res, fmt.Errorf("audit: line %d: %w", line, err)
		}
		switch {
		case rec.Kind == "config":
			if !haveCfg {
				if err := json.Unmarshal(rec.Controller, &cfg); err != nil {
					return res, fmt.Errorf("audit: line %d: controller config: %w", line, err)
				}
				haveCfg = true
			}
		case rec.Kind == "fleet" && rec.Event == "snapshot":
			for _, e := range rec.Engines {
				engines[e.ID] = &engine{role: e.Role, lifecycle: e.Lifecycle, pinned: e.Pinned, roleSince: math.Inf(-1)}
			}
			snapshot = true
		case rec.Kind == "fleet":
			if !snapshot {
				return res, fmt.Errorf("audit: line %d: a fleet event before the fleet snapshot", line)
			}
			e := engines[rec.Engine]
			if e == nil {
				return res, fmt.Errorf("audit: line %d: unknown engine %q", line, rec.Engine)
			}
			switch rec.Event {
			case "lifecycle":
				e.lifecycle = rec.To
			case "pin":
				e.pinned = rec.Pinned
			case "role":
				res.RoleChanges++
				if e.pinned {
					violate(line, rec.TimeS, "pins", "%s moved %s -> %s while pinned", rec.Engine, rec.From, rec.To)
				}
				if since := rec.TimeS - e.roleSince; since < cfg.Thresholds.DwellS {
					violate(line, rec.TimeS, "dwell", "%s moved %.3fs after its last role change (dwell %gs)", rec.Engine, since, cfg.Thresholds.DwellS)
				}
				if cfg.Advisory {
					violate(line, rec.TimeS, "advisory", "%s moved %s -> %s with controller.advisory on", rec.Engine, rec.From, rec.To)
				}
				e.role, e.roleSince = rec.To, rec.TimeS
				if total := live("prefill") + live("decode"); total >= cfg.MinPrefill+cfg.MinDecode {
					if p := live("prefill"); rec.From == "prefill" && p < cfg.MinPrefill {
						violate(line, rec.TimeS, "role_floors", "%s left prefill: %d live prefill engines, min_prefill %d, with %d live engines", rec.Engine, p, cfg.MinPrefill, total)
					}
					if d := live("decode"); rec.From == "decode" && d < cfg.MinDecode {
						violate(line, rec.TimeS, "role_floors", "%s left decode: %d live decode engines, min_decode %d, with %d live engines", rec.Engine, d, cfg.MinDecode, total)
					}
				}
				if rec.Decision == nil {
					violate(line, rec.TimeS, "orphan_role_change", "%s moved %s -> %s naming no decision", rec.Engine, rec.From, rec.To)
					continue
				}
				events[*rec.Decision] = append(events[*rec.Decision], line)
				pending = append(pending, pendingEvent{line: line, t: rec.TimeS, seq: *rec.Decision, engine: rec.Engine, from: rec.From, to: rec.To})
			}
		case rec.Kind == "decision":
			res.Decisions++
			d := rec
			decisions[rec.Seq] = &d
			toDecode, toPrefill := 0, 0
			for _, m := range rec.Moves {
				if m.To == "decode" {
					toDecode++
				} else {
					toPrefill++
				}
			}
			if n := len(rec.Moves); n > 1 && rec.Caller != "repair" {
				violate(line, rec.TimeS, "one_move", "decision %d (%s) made %d moves", rec.Seq, rec.Caller, n)
			}
			if n := len(events[rec.Seq]); n > 1 && rec.Caller != "repair" {
				violate(line, rec.TimeS, "one_move", "decision %d (%s) has %d role changes", rec.Seq, rec.Caller, n)
			}
			if toDecode > 0 {
				if rec.Caller != "repair" && rec.Caller != "readmission" && rec.TimeS-lastToDecode < cfg.Thresholds.CooldownS {
					violate(line, rec.TimeS, "cooldown", "decision %d moved toward decode %.3fs after the last move toward decode (cooldown %gs)", rec.Seq, rec.TimeS-lastToDecode, cfg.Thresholds.CooldownS)
				}
				lastToDecode = rec.TimeS
			}
			if toPrefill > 0 && (rec.Caller == "regular" || rec.Caller == "urgent") {
				w := rec.Inputs.EvidenceWindow
				open := rec.TimeS - w.OpenedAtS
				closed := open >= cfg.Reactive.EvidenceSpanS && w.Arrivals >= uint64(cfg.Reactive.EvidenceMinArrivals) || open >= cfg.Reactive.EvidenceMaxSpanS
				switch {
				case w.OpenedAtS < lastToDecode:
					violate(line, rec.TimeS, "evidence_window", "decision %d: its window opened at %.3fs, before the last move toward decode restarted it", rec.Seq, w.OpenedAtS)
				case !closed:
					violate(line, rec.TimeS, "evidence_window", "decision %d moved toward prefill with the window open: opened %.3fs ago, %d arrivals (span %gs, min %d, max %gs)",
						rec.Seq, open, w.Arrivals, cfg.Reactive.EvidenceSpanS, cfg.Reactive.EvidenceMinArrivals, cfg.Reactive.EvidenceMaxSpanS)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("audit: %w", err)
	}
	if !haveCfg || !snapshot {
		return res, fmt.Errorf("audit: the log has no config line or no fleet snapshot")
	}
	for _, ev := range pending { // every role change is a move of the decision it names
		d := decisions[ev.seq]
		found := false
		if d != nil {
			for _, m := range d.Moves {
				found = found || m.Engine == ev.engine && m.From == ev.from && m.To == ev.to
			}
		}
		if !found {
			violate(ev.line, ev.t, "orphan_role_change", "%s moved %s -> %s for decision %d, which has no such move", ev.engine, ev.from, ev.to, ev.seq)
		}
	}
	sort.SliceStable(res.Violations, func(i, j int) bool { return res.Violations[i].Line < res.Violations[j].Line })
	return res, nil
}

type pendingEvent struct {
	line     int
	t        float64
	seq      uint64
	engine   string
	from, to string
}
