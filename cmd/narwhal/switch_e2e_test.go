package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/wire"
)

// switches reads an enginesim engine's enginesim_role_switches_total by result.
func switches(t *testing.T, addr string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`enginesim_role_switches_total\{[^}]*result="(\w+)"\} (\S+)`).FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = m[2]
	}
	return out
}

// logLines reads a decision log's lines (decisionlog.Read).
func logLines(t *testing.T, path string) []decisionlog.Line {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []decisionlog.Line
	if err := decisionlog.Read(f, func(l decisionlog.Line) error {
		l.Raw = nil
		out = append(out, l)
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// stopAndAudit stops serve (exit 0) and audits its decision log clean; it returns the audit's
// summary.
func stopAndAudit(t *testing.T, srv *proc, decisions string) string {
	t.Helper()
	if code, _ := srv.stop(t); code != 0 {
		t.Fatalf("serve exit %d", code)
	}
	out, code := runBin(t, "audit", "--decisions", decisions)
	if code != 0 {
		b, _ := os.ReadFile(decisions)
		t.Fatalf("audit exit %d:\n%s\nlog:\n%s", code, out, b)
	}
	return out
}

// resident is a request the test holds on the engines: placed through ext_proc, its response
// streamed by the test, so that the test says when it finishes.
type resident struct {
	res  *gateway.RequestResult
	body *io.PipeWriter
	done chan error
}

type discard struct{}

func (discard) WriteHeaders(gateway.Headers) error { return nil }
func (discard) WriteBody([]byte) error             { return nil }

// decoding places a request and starts its streamed response (a first token): it is then a
// decode resident of its decode engine until finish.
func decoding(t *testing.T, client *gateway.Client, prompt string) *resident {
	t.Helper()
	x := client.NewExchange(context.Background())
	t.Cleanup(x.Close)
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(`{"model":"m","prompt":"` + prompt + `","max_tokens":4,"stream":true}`)})
	if err != nil || res.LocalReply != nil {
		t.Fatalf("request: %+v %v", res, err)
	}
	pr, pw := io.Pipe()
	r := &resident{res: res, body: pw, done: make(chan error, 1)}
	go func() {
		r.done <- x.ProcessResponse(gateway.Response{Headers: gateway.NewResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}), Body: pr}, discard{})
	}()
	if _, err := pw.Write([]byte(`data: {"choices":[{"index":0,"text":" a"}]}` + "\n\n")); err != nil {
		t.Fatal(err)
	}
	return r
}

// finish ends the resident's response.
func (r *resident) finish(t *testing.T) {
	t.Helper()
	_, _ = r.body.Write([]byte(`data: {"choices":[{"index":0,"text":" b","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}` + "\n\ndata: [DONE]\n\n"))
	_ = r.body.Close()
	if err := <-r.done; err != nil {
		t.Fatalf("the response: %v", err)
	}
}

// idAt names the engine at addr.
func idAt(engines []string, addr string) string {
	for i, a := range engines {
		if a == addr {
			return fmt.Sprintf("e%d", i+1)
		}
	}
	return ""
}

// Issue 12, an in-place switch through narwhal serve (ext_proc and xDS) on switch: sglang
// engines that serve POST /pd_role_switch: an urgent evaluation moves a decode engine that has
// a stream decoding on it; the engine is held (switching: DRAINING over xDS) and takes no
// placement while its resident streams — the waiting request stays waiting, the engine is not
// asked; once the resident finishes it is asked, once, idle; it then prefills, as the ADS client
// sees, and the waiting request is placed on it. Every step is in the decision log, which audits
// clean.
func TestServeInPlaceSwitch(t *testing.T) {
	_, e1 := startEngine(t, "prefill")
	engines := []string{e1}
	for range 3 { // the decode engines switch in place
		_, a := startEngine(t, "decode", "--pd-role-switch", "--pd-role-switch-s", "0.1")
		engines = append(engines, a)
	}
	cfg := strings.ReplaceAll(controlConfig(engines, 0.2, 0.05, fmt.Sprintf("  - {id: e4, address: %q, role: decode, profile: one}\n", engines[3])+
		"health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}\nslo: {ttft_s: 0.35}"),
		"profile: one}", "profile: one, switch: sglang}")
	cfg = strings.Replace(cfg, "evidence_span_s: 0.1,", "evidence_span_s: 0.01,", 1) // closed before the first request
	decisions := filepath.Join(t.TempDir(), "decisions.jsonl")
	srv := start(t, "serve", "--config", writeConfig(t, cfg), "--decisions", decisions)
	admin, extprocAddr, xdsAddr := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))
	eds := adsWatch(t, xdsAddr)
	client := envoytest.NewTestClient(t, extprocAddr, gateway.Mode{RequestBody: gateway.Buffered,
		ResponseBody: gateway.Streamed, AllowModeOverride: true, MessageTimeout: time.Minute, BufferLimit: 8 << 20})

	// A stream decoding on each decode engine (placement spreads them), then a long prompt that
	// takes e1's only prefill slot (its decode reserved on one of them) and a second that waits:
	// the urgent evaluation moves one of the other two.
	held := []*resident{decoding(t, client, "hello"), decoding(t, client, "there"), decoding(t, client, "again")}
	on := map[string]*resident{}
	for _, r := range held {
		on[idAt(engines, r.res.Headers.Get(wire.HeaderDestination))] = r
	}
	if on["e2"] == nil || on["e3"] == nil || on["e4"] == nil {
		t.Fatalf("the three streams decode on %v, want one on each decode engine", on)
	}
	long := strings.Repeat("word ", 12800) // ~16,000 tokens
	first := client.NewExchange(context.Background())
	t.Cleanup(first.Close)
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	if res, err := first.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(`{"model":"m","prompt":"` + long + `","max_tokens":8,"stream":true}`)}); err != nil || res.Headers.Get(wire.HeaderPrefiller) != engines[0] {
		t.Fatalf("first: %+v %v", res, err)
	}
	var second *gateway.RequestResult
	var placedAt time.Time
	var wg sync.WaitGroup
	wg.Go(func() {
		x := client.NewExchange(context.Background())
		t.Cleanup(x.Close)
		res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(`{"model":"m","prompt":"` + long + `","max_tokens":8,"stream":true}`)})
		if err != nil || res.LocalReply != nil {
			t.Errorf("second: %+v %v", res, err)
			return
		}
		second, placedAt = res, time.Now()
	})

	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(decisions)
			t.Logf("decisions:\n%s\nserve:\n%s", b, srv.out.String())
		}
	})
	st := waitFor(t, admin, 10*time.Second, "a decode engine switching", func(s stateView) bool {
		for _, e := range s.Engines {
			if e.Lifecycle == "switching" {
				return true
			}
		}
		return false
	})
	moved := ""
	for _, e := range st.Engines {
		if e.Lifecycle == "switching" {
			moved = e.ID
		}
	}
	awaitEDS(t, eds, moved+" held (DRAINING) in the decode cluster", func(g map[string]map[string]string) bool {
		return g["narwhal-decode"][moved] == "DRAINING"
	})
	addr := engines[map[string]int{"e2": 1, "e3": 2, "e4": 3}[moved]]
	// While its stream decodes, it is not asked (the log below shows when it was).
	if s := switches(t, addr); s["ok"] != "0" || s["refused"] != "0" {
		t.Fatalf("%s asked while a stream decodes on it: %v", moved, s)
	}
	finished := time.Now()
	on[moved].finish(t)
	wg.Wait()
	if second == nil || second.Headers.Get(wire.HeaderPrefiller) != addr || placedAt.Before(finished) {
		t.Fatalf("second placed on %q at %v (resident finished %v), want %s after", second.Headers.Get(wire.HeaderPrefiller), placedAt, finished, addr)
	}
	awaitEDS(t, eds, moved+" prefill", func(g map[string]map[string]string) bool {
		_, inDecode := g["narwhal-decode"][moved]
		return g["narwhal-prefill"][moved] == "HEALTHY" && !inDecode
	})
	if s := switches(t, addr); s["ok"] != "1" || s["refused"] != "0" || s["failed"] != "0" {
		t.Fatalf("%s's switches: %v, want one, accepted (idle)", moved, s)
	}

	for _, r := range held {
		if on[moved] != r {
			r.finish(t)
		}
	}
	stopAndAudit(t, srv, decisions)
	// The steps, in order, for the moved engine; it was asked after its resident finished.
	var steps []string
	var epoch float64
	for _, l := range logLines(t, decisions) {
		switch c, d, ev := l.Config, l.Decision, l.Fleet; {
		case c != nil:
			epoch = *c.EpochUnixS
		case d != nil && d.Outcome == decisionlog.OutcomeMoved:
			steps = append(steps, fmt.Sprintf("decision %s switch %s", d.Caller, d.Switch))
		case d == nil && ev.Engine == moved:
			if ev.Event == fleet.EventSwitch && ev.Result == fleet.SwitchAsked {
				if at := time.UnixMicro(int64((epoch + ev.TimeS) * 1e6)); at.Before(finished) {
					t.Errorf("%s was asked at %v, before its resident finished (%v)", moved, at, finished)
				}
			}
			s := fmt.Sprintf("%s %s->%s", ev.Event, ev.From, ev.To)
			if ev.Result != "" {
				s += " " + string(ev.Result)
			}
			steps = append(steps, s)
		}
	}
	want := []string{
		"lifecycle active->switching", "decision urgent switch sglang",
		"switch decode->prefill asked", "switch decode->prefill succeeded", "role decode->prefill", "lifecycle switching->active",
	}
	if strings.Join(steps, "; ") != strings.Join(want, "; ") {
		t.Fatalf("the steps of %s:\n%s\nwant\n%s", moved, strings.Join(steps, "\n"), strings.Join(want, "\n"))
	}
}

// Issue 12, a switch that fails: the decode engine dies, and the floor repair moves a prefill
// engine that switches in place (no second repair while it switches); its switch fails (the
// engine answers success false and turns unhealthy), so it is failed, and the next repair moves
// the next, whose switch succeeds: the decode floor is back (e4 keeps the prefill floor). Both
// are in the decision log, which audits clean.
func TestServeInPlaceSwitchFails(t *testing.T) {
	_, bad := startEngine(t, "prefill", "--pd-role-switch-fail", "--pd-role-switch-s", "0.5")
	_, good := startEngine(t, "prefill", "--pd-role-switch", "--pd-role-switch-s", "0.1")
	decode, d := startEngine(t, "decode")
	_, e4 := startEngine(t, "prefill")
	engines := []string{bad, good, d}
	cfg := controlConfig(engines, 0.1, 0.25, fmt.Sprintf("  - {id: e4, address: %q, role: prefill, profile: one}\n", e4)+
		"health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}")
	cfg = strings.Replace(cfg, "role: prefill, profile: one}", "role: prefill, profile: one, switch: sglang}", 1)
	cfg = strings.Replace(cfg, "role: decode, profile: one}", "role: prefill, profile: one, switch: sglang}", 1) // e2
	decisions := filepath.Join(t.TempDir(), "decisions.jsonl")
	srv := start(t, "serve", "--config", writeConfig(t, cfg), "--decisions", decisions)
	admin, _, xdsAddr := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))
	eds := adsWatch(t, xdsAddr)

	_ = decode.cmd.Process.Kill()
	_ = decode.cmd.Wait()
	awaitEDS(t, eds, "e2 repaired into decode, e1 failed", func(g map[string]map[string]string) bool {
		return g["narwhal-decode"]["e2"] == "HEALTHY" && g["narwhal-prefill"]["e1"] == "UNHEALTHY" && g["narwhal-decode"]["e3"] == "UNHEALTHY"
	})
	st, err := getState(admin)
	if err != nil || engineOf(st, "e1").Lifecycle != "failed" || engineOf(st, "e1").Role != "prefill" || engineOf(st, "e2").Role != "decode" {
		t.Fatalf("state: %+v %v", st.Engines, err)
	}
	if s := switches(t, bad); s["failed"] != "1" || s["ok"] != "0" {
		t.Errorf("e1's switches: %v", s)
	}
	if s := switches(t, good); s["ok"] != "1" || s["refused"] != "0" {
		t.Errorf("e2's switches: %v", s)
	}
	stopAndAudit(t, srv, decisions)
	var steps []string
	for _, l := range logLines(t, decisions) {
		switch d, ev := l.Decision, l.Fleet; {
		case d != nil && d.Outcome == decisionlog.OutcomeMoved:
			steps = append(steps, fmt.Sprintf("decision %s %s", d.Caller, d.Switch))
		case ev != nil && ev.Event == fleet.EventSwitch && ev.Result != fleet.SwitchAsked:
			steps = append(steps, fmt.Sprintf("switch %s %s", ev.Engine, ev.Result))
		}
	}
	if want := "decision repair sglang; switch e1 failed; decision repair sglang; switch e2 succeeded"; strings.Join(steps, "; ") != want {
		t.Fatalf("steps %q, want %q", strings.Join(steps, "; "), want)
	}
}
