package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/internal/poll"
	"github.com/narwhal-llm/narwhal/wire"
)

// TestServeRoleControlEndToEnd runs role control through narwhal serve's ext_proc server and
// xDS with enginesim engines: a burst of long prompts makes a waiting request's projected TTFT
// exceed the SLO; one coalesced urgent evaluation moves a decode engine to prefill; an ADS
// client sees the new role; the waiting request is placed on that engine. Then the remaining
// decode engine is killed: below min_decode, the next monitor pass repairs the floor with an
// engine that may move, and the ADS client sees that too. The decision log audits clean.
func TestServeRoleControlEndToEnd(t *testing.T) {
	procs, engines := startEngines(t, "prefill", "decode", "decode")
	cfg := controlConfig(engines, 0.2, 0.25, "health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}")
	decisions := filepath.Join(t.TempDir(), "decisions.jsonl")
	srv := start(t, "serve", "--config", writeConfig(t, cfg), "--decisions", decisions)
	admin, extprocAddr, xdsAddr := srv.serving(t)
	waitFor(t, admin, 10*time.Second, "three active engines", allActive(3))
	eds := adsWatch(t, xdsAddr)
	awaitEDS(t, eds, "initial roles", func(g map[string]map[string]string) bool {
		return len(g["narwhal-prefill"]) == 1 && len(g["narwhal-decode"]) == 2
	})

	client := envoytest.NewTestClient(t, extprocAddr, gateway.Mode{RequestBody: gateway.Buffered,
		ResponseBody: gateway.Streamed, MessageTimeout: time.Minute, BufferLimit: 8 << 20})
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	long := `{"model":"m","prompt":"` + strings.Repeat("word ", 12800) + `","max_tokens":8,"stream":true}` // ~16,000 tokens
	ask := func() *gateway.RequestResult {
		x := client.NewExchange(context.Background())
		t.Cleanup(x.Close) // the response never comes: the request holds its engine until the end
		res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(long)})
		if err != nil || res.LocalReply != nil {
			t.Fatalf("request: %+v %v", res, err)
		}
		return res
	}
	first := ask() // takes e1's only prefill slot
	if p := first.Headers.Get(wire.HeaderPrefiller); p != engines[0] {
		t.Fatalf("first prefiller %s, want e1 %s", p, engines[0])
	}
	begin := time.Now()
	second := ask() // waits, triggers, and is placed once an engine moves
	waited := time.Since(begin)
	moved := ""
	for i, a := range engines {
		if second.Headers.Get(wire.HeaderPrefiller) == a {
			moved = fmt.Sprintf("e%d", i+1)
		}
	}
	if moved != "e2" && moved != "e3" || waited < 200*time.Millisecond {
		t.Fatalf("the waiting request went to prefill %q after %v; want a moved decode engine after urgent_delay_s", second.Headers.Get(wire.HeaderPrefiller), waited)
	}
	awaitEDS(t, eds, moved+" prefill over xDS", func(g map[string]map[string]string) bool {
		_, inPrefill := g["narwhal-prefill"][moved]
		_, inDecode := g["narwhal-decode"][moved]
		return inPrefill && !inDecode
	})

	// Kill the decode engine left: the decode floor is repaired by the one engine that may move
	// (e1, which never moved; the moved engine keeps its role for dwell_s).
	left := map[string]int{"e2": 2, "e3": 1}[moved]
	_ = procs[left].cmd.Process.Kill()
	_ = procs[left].cmd.Wait()
	awaitEDS(t, eds, "e1 repaired into decode", func(g map[string]map[string]string) bool {
		return g["narwhal-decode"]["e1"] == "HEALTHY" && g["narwhal-decode"][fmt.Sprintf("e%d", left+1)] == "UNHEALTHY"
	})

	out := stopAndAudit(t, srv, decisions)
	// The log has the urgent decision that moved an engine, its role event naming it, and the
	// repair.
	f, err := os.Open(decisions)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var urgent, repair bool
	var urgentSeq, movedBy uint64
	err = decisionlog.Read(f, func(l decisionlog.Line) error {
		switch d, ev := l.Decision, l.Fleet; {
		case d != nil && d.Caller == decisionlog.CallerUrgent && d.Outcome == decisionlog.OutcomeMoved && strings.HasPrefix(d.Reason, "request "):
			urgent, urgentSeq = true, d.Seq
		case d != nil && d.Caller == decisionlog.CallerRepair && d.Outcome == decisionlog.OutcomeMoved:
			repair = true
		case ev != nil && ev.Event == fleet.EventRole && ev.Engine == moved && movedBy == 0:
			movedBy = ev.Decision
		}
		return nil
	})
	if err != nil || !urgent || movedBy != urgentSeq || !repair {
		b, _ := os.ReadFile(decisions)
		t.Fatalf("the decision log (err %v): urgent move %t (decision %d), %s's role event names decision %d, repair %t:\n%s", err, urgent, urgentSeq, moved, movedBy, repair, b)
	}
	t.Logf("audit: %s", strings.TrimSpace(out))
}

// TestServeUrgentDroppedAndRetained: through narwhal serve, a burst that drains before
// urgent_delay_s gives an urgent decision `dropped` and no move; a request whose own prefill
// alone exceeds slo.ttft_s, with both splits projecting it the same, gives `retained` with
// reason prefill_exceeds_slo.
func TestServeUrgentDroppedAndRetained(t *testing.T) {
	_, engines := startEngines(t, "prefill", "decode", "decode")
	cfg := controlConfig(engines, 1, 1, "slo: {ttft_s: 0.3}") // a second to see the burst drain, even on a loaded machine
	admin, extprocAddr, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, admin, 10*time.Second, "three active engines", allActive(3))
	client := envoytest.NewTestClient(t, extprocAddr, gateway.Mode{RequestBody: gateway.Buffered,
		ResponseBody: gateway.Streamed, MessageTimeout: time.Minute, BufferLimit: 8 << 20})
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	long := `{"model":"m","prompt":"` + strings.Repeat("word ", 12800) + `","max_tokens":8,"stream":true}` // ~16,000 tokens: 0.38 s of prefill
	x := client.NewExchange(context.Background())
	t.Cleanup(x.Close)
	if res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(long)}); err != nil || res.LocalReply != nil {
		t.Fatalf("first: %+v %v", res, err)
	}
	// The burst: one more request waits (and triggers), then its client goes away.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		y := client.NewExchange(ctx)
		defer y.Close()
		_, _ = y.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(long)})
	}()
	poll.Until(t, 5*time.Second, "the second request waiting", func() bool { return getInt(t, admin, "waiting") == 1 })
	cancel()
	<-done
	urgent := func(outcome string) decisionView {
		t.Helper()
		var found decisionView
		poll.Until(t, 5*time.Second, "an urgent "+outcome+" decision", func() bool {
			for _, d := range getDecisions(t, admin) {
				if d.Caller == "urgent" && d.Outcome == outcome {
					found = d
				}
			}
			return found.Seq != 0
		})
		return found
	}
	urgent("dropped")
	// Now the first request's prefill is overdue: e1 is projected free now, as a moved decode
	// engine would be; a long prompt alone exceeds the 0.3 s SLO.
	zctx, zcancel := context.WithCancel(context.Background())
	zdone := make(chan struct{})
	go func() {
		defer close(zdone)
		z := client.NewExchange(zctx)
		defer z.Close()
		_, _ = z.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(long)})
	}()
	t.Cleanup(func() { zcancel(); <-zdone })
	if d := urgent("retained"); d.Reason != "prefill_exceeds_slo" {
		t.Fatalf("retained for %q", d.Reason)
	}
	st := waitFor(t, admin, time.Second, "roles unchanged", func(s stateView) bool { return s.Split.Prefill == 1 && s.Split.Decode == 2 })
	for _, e := range st.Engines {
		if want := map[string]string{"e1": "prefill", "e2": "decode", "e3": "decode"}[e.ID]; e.Role != want {
			t.Fatalf("%s became %s", e.ID, e.Role)
		}
	}
}

type decisionView struct {
	Seq     uint64 `json:"seq"`
	Caller  string `json:"caller"`
	Outcome string `json:"outcome"`
	Reason  string `json:"reason"`
}

func getDecisions(t *testing.T, admin string) []decisionView {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/narwhal/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Decisions []decisionView }
	if err := jsonDecode(resp.Body, &st); err != nil {
		t.Fatal(err)
	}
	return st.Decisions
}

// controlConfig is the config of the role-control end-to-end tests for engines (e1 prefill, e2
// and e3 decode), listening on ports the system picks: one prefill slot per engine, a fast
// urgent path (urgentS) and evidence window, monitor passes every monitorS, quick shutdown;
// extra adds top-level keys (not these). Disaggregated only: a move is what relieves the prefill
// engine.
func controlConfig(engines []string, monitorS, urgentS float64, extra string) string {
	return fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
router: {waiting_set: {max_wait_s: 60}, first_token_timeout_s: 60, local_prefill: off}
shutdown_grace_s: 1
controller:
  monitor: {interval_s: %g}
  reactive: {step_s: 30, urgent_delay_s: %g, evidence_span_s: 0.1, evidence_min_arrivals: 0, evidence_max_span_s: 1}
%s
engines:
  - {id: e1, address: %q, role: prefill, profile: one}
  - {id: e2, address: %q, role: decode, profile: one}
  - {id: e3, address: %q, role: decode, profile: one}
%s
`, anyPort, anyPort, anyPort, monitorS, urgentS, oneProfile, engines[0], engines[1], engines[2], extra)
}

// oneProfile is the profile "one" of the role-control tests: enginesim's default engine with one
// prefill at a time.
const oneProfile = `profiles:
  one:
    prefill: {base_s: 0.0165, per_token_s: 1.52e-5, per_token2_s: 4.21e-10, max_tokens: 16384}
    prefill_concurrency: 1
    decode: {base_s: 0.0045, per_stream_s: 2.8e-5, per_kv_token_s: 3.08e-8, max_streams: 256, max_kv_tokens: 945000}
    kv_transfer_s: 0.005`
