package decisionlog_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
)

var epoch = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// What the Log writes, Read gives back in the same types: the config line, the snapshot, each
// kind of fleet event with the fields of its kind (a role change's decision as a number, an
// operator's relabel as the caller), and a decision; address changes are not logged.
func TestLogReadsBackAsWritten(t *testing.T) {
	cfg, err := config.LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engines[2].Switch = config.SwitchSGLang // e3 switches in place
	f, err := fleet.New(cfg, epoch)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := decisionlog.New(&buf, epoch, cfg, f.Snapshot())
	f.OnChange(log.Fleet)
	at := epoch.Add(90 * time.Second)
	d := &decisionlog.Decision{Kind: decisionlog.KindDecision, TimeS: 90, Seq: 3, Caller: decisionlog.CallerRegular, Reason: "r",
		SplitBefore: decisionlog.Split{Prefill: 2, Decode: 2}, SplitAfter: decisionlog.Split{Prefill: 1, Decode: 3},
		Candidates: []decisionlog.Priced{{Prefill: 1, Decode: 3, TTFTRatio: decisionlog.Ratio(math.Inf(1)), Worst: 0.5}},
		Gates:      []decisionlog.Gate{{Name: decisionlog.GateDwell, Passed: true, Detail: "d"}},
		Outcome:    decisionlog.OutcomeMoved, Moves: []decisionlog.Move{{Engine: "e1", From: fleet.Prefill, To: fleet.Decode}}}
	log.Decision(d)
	for _, step := range []func() error{
		func() error { _, err := f.Move("e1", fleet.Decode, at, 3); return err },
		func() error { _, err := f.SetPinned("e4", true, at, "admin"); return err },
		func() error { _, err := f.Drain("e2", at, "admin", fleet.Floors{}); return err },
		func() error { _, err := f.Move("e3", fleet.Prefill, at, 4); return err },
		func() error { _, err := f.FinishSwitch("e3", fleet.SwitchSucceeded, at, "ok"); return err },
		func() error {
			_, err := f.Relabel("e1", fleet.Prefill, at, "kubernetes")
			return err
		},
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Err(); err != nil {
		t.Fatal(err)
	}

	var got []string
	var decision *decisionlog.Decision
	err = decisionlog.Read(&buf, func(l decisionlog.Line) error {
		switch {
		case l.Config != nil:
			if *l.Config.EpochUnixS != float64(epoch.Unix()) || !reflect.DeepEqual(l.Config.Controller, cfg.Controller) || l.Config.SLO != cfg.SLO {
				t.Errorf("line %d: config %+v", l.Num, l.Config)
			}
			got = append(got, "config")
		case l.Decision != nil:
			decision = l.Decision
			got = append(got, "decision")
		case l.Fleet.Event == decisionlog.Snapshot:
			got = append(got, "snapshot "+fmtEngines(l.Fleet.Engines))
		default:
			ev := l.Fleet
			s := string(ev.Event) + " " + ev.Engine + " " + ev.From + ">" + ev.To
			if ev.Pinned != nil {
				s += " pinned=" + map[bool]string{true: "true", false: "false"}[*ev.Pinned]
			}
			if ev.Held != nil {
				s += " held"
			}
			if ev.Result != "" {
				s += " result=" + string(ev.Result)
			}
			if ev.Decision != 0 {
				s += " decision=" + strconv.FormatUint(ev.Decision, 10)
			}
			if ev.Caller != "" {
				s += " caller=" + string(ev.Caller)
			}
			got = append(got, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"config",
		"snapshot e1:prefill:active e2:prefill:active e3:decode:active e4:decode:active",
		"decision",
		"role e1 prefill>decode decision=3",
		"pin e4 > pinned=true",
		"lifecycle e2 active>draining",
		"hold e2 > held",
		"lifecycle e3 active>switching",
		"switch e3 decode>prefill result=succeeded",
		"role e3 decode>prefill decision=4",
		"lifecycle e3 switching>active",
		"role e1 decode>prefill caller=operator",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !reflect.DeepEqual(decision, d) {
		t.Errorf("the decision read back differs:\n%+v\n%+v", decision, d)
	}
}

// A decision line is the record's JSON, field for field in the record's order: the types moved
// here from the controller without changing a byte of it (docs/role-control.md, section 10).
func TestDecisionLineBytes(t *testing.T) {
	var buf bytes.Buffer
	log := decisionlog.New(&buf, epoch, config.Default(), fleet.Snapshot{})
	log.Decision(&decisionlog.Decision{Kind: decisionlog.KindDecision, TimeS: 1.5, Seq: 2, Caller: decisionlog.CallerUrgent, Reason: "r",
		SplitBefore: decisionlog.Split{Prefill: 1, Decode: 3}, SplitAfter: decisionlog.Split{Prefill: 2, Decode: 2},
		Candidates: []decisionlog.Priced{{Prefill: 2, Decode: 2, TTFTRatio: decisionlog.Ratio(math.Inf(1)), Worst: 0.25}},
		Outcome:    decisionlog.OutcomeAdvisory, AdvisoryResult: decisionlog.WouldMove, Direction: "to_prefill"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := `{"kind":"decision","time_s":1.5,"seq":2,"caller":"urgent","reason":"r","advisory":false,"split_before":{"prefi` +
		`ll":1,"decode":3},"split_after":{"prefill":2,"decode":2},"inputs":{"demand":{"short":{"arrivals_per_s":0,"prom` +
		`pt_tokens_per_s":0,"output_tokens_per_s":0},"long":{"arrivals_per_s":0,"prompt_tokens_per_s":0,"output_tokens_` +
		`per_s":0},"priced":{"arrivals_per_s":0,"prompt_tokens_per_s":0,"output_tokens_per_s":0}},"evidence_window":{"o` +
		`pen":false,"opened_at_s":0,"arrivals":0},"retained":{"samples":0,"waiting":0,"waiting_tokens":0,"prefilling":0` +
		`,"awaiting_output_tokens":0,"decoding":0}},"candidates":[{"prefill":2,"decode":2,"ttft_ratio":"+Inf","tpot_rat` +
		`io":0,"worst":0.25,"current":false,"queue_wait_s":0,"overload":0}],"gates":null,"outcome":"advisory","advisory` +
		`_result":"would_move","moves":null,"direction":"to_prefill"}`
	if got := lines[len(lines)-1]; got != want {
		t.Fatalf("decision line:\n%s\nwant:\n%s", got, want)
	}
}

// A line that is not JSON, or of no known kind, is an error naming its line, and nothing after
// it is read; fn's error stops the reading.
func TestReadRejects(t *testing.T) {
	good := `{"kind":"fleet","time_s":0,"event":"snapshot"}`
	for _, tc := range []struct{ log, err string }{
		{good + "\n{\"kind\":", "line 2: unexpected end of JSON input"},
		{good + "\n" + `{"kind":"verdict"}` + "\n" + good, `line 2: unknown kind "verdict"`},
		{good + "\n" + `{"kind":"decision","seq":"two"}`, "line 2: json: cannot unmarshal string"},
		{"[]", "line 1: json: cannot unmarshal array"},
	} {
		n := 0
		err := decisionlog.Read(strings.NewReader(tc.log), func(decisionlog.Line) error { n++; return nil })
		if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("%q: err %v, want %q", tc.log, err, tc.err)
		}
		if n != 1 && tc.log != "[]" || tc.log == "[]" && n != 0 {
			t.Errorf("%q: %d lines read before the bad one", tc.log, n)
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := decisionlog.Read(strings.NewReader(good+"\n"+good+"\n"), func(decisionlog.Line) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("err %v after %d lines, want stop after 1", err, n)
	}
}

func fmtEngines(es []decisionlog.Engine) string {
	var s []string
	for _, e := range es {
		s = append(s, e.ID+":"+e.Role.String()+":"+e.Lifecycle.String())
	}
	return strings.Join(s, " ")
}
