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

	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
)

// TestServeRoleControlEndToEnd runs role control through narwhal serve's ext_proc server and
// xDS with enginesim engines: a burst of long prompts makes a waiting request's projected TTFT
// exceed the SLO; one coalesced urgent evaluation moves a decode engine to prefill; an ADS
// client sees the new role; the waiting request is placed on that engine. Then the remaining
// decode engine is killed: below min_decode, the next monitor pass repairs the floor with an
// engine that may move, and the ADS client sees that too. The decision log audits clean.
func TestServeRoleControlEndToEnd(t *testing.T) {
	addrs := freeAddrs(t, 6)
	admin, extprocAddr, xdsAddr, engines := addrs[0], addrs[1], addrs[2], addrs[3:]
	procs := make([]*proc, len(engines))
	for i, a := range engines {
		procs[i] = startEngine(t, a, map[bool]string{true: "prefill", false: "decode"}[i == 0])
	}
	cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.5}
router: {waiting_set: {max_wait_s: 60}, first_token_timeout_s: 60}
shutdown_grace_s: 1
controller:
  monitor: {interval_s: 0.2}
  reactive: {step_s: 30, urgent_delay_s: 0.25, evidence_span_s: 0.1, evidence_min_arrivals: 0, evidence_max_span_s: 1}
profiles:
  one:
    prefill: {base_s: 0.0165, per_token_s: 1.52e-5, per_token2_s: 4.21e-10, max_tokens: 16384}
    prefill_concurrency: 1
    decode: {base_s: 0.0045, per_stream_s: 2.8e-5, per_kv_token_s: 3.08e-8, max_streams: 256, max_kv_tokens: 945000}
    kv_transfer_s: 0.005
engines:
  - {id: e1, address: %q, role: prefill, profile: one}
  - {id: e2, address: %q, role: decode, profile: one}
  - {id: e3, address: %q, role: decode, profile: one}
`, admin, extprocAddr, xdsAddr, engines[0], engines[1], engines[2])
	decisions := filepath.Join(t.TempDir(), "decisions.jsonl")
	srv := start(t, "serve", "--config", writeConfig(t, cfg), "--decisions", decisions)
	waitFor(t, admin, 10*time.Second, "three active engines", allActive(3))
	eds := adsWatch(t, xdsAddr)
	awaitEDS(t, eds, "initial roles", func(g map[string]map[string]string) bool {
		return len(g["narwhal-prefill"]) == 1 && len(g["narwhal-decode"]) == 2
	})

	client := envoytest.NewTestClient(t, extprocAddr, envoytest.Mode{RequestBody: envoytest.Buffered,
		ResponseBody: envoytest.Streamed, MessageTimeout: time.Minute, BufferLimit: 8 << 20})
	hdrs := envoytest.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	long := `{"model":"m","prompt":"` + strings.Repeat("word ", 12800) + `","max_tokens":8,"stream":true}` // ~16,000 tokens
	ask := func() *envoytest.RequestResult {
		x := client.NewExchange(context.Background())
		t.Cleanup(x.Close) // the response never comes: the request holds its engine until the end
		res, err := x.ProcessRequest(envoytest.Request{Headers: hdrs, Body: strings.NewReader(long)})
		if err != nil || res.LocalReply != nil {
			t.Fatalf("request: %+v %v", res, err)
		}
		return res
	}
	first := ask() // takes e1's only prefill slot
	if p := first.Headers.Get(extproc.HeaderPrefiller); p != engines[0] {
		t.Fatalf("first prefiller %s, want e1 %s", p, engines[0])
	}
	begin := time.Now()
	second := ask() // waits, triggers, and is placed once an engine moves
	waited := time.Since(begin)
	moved := ""
	for i, a := range engines {
		if second.Headers.Get(extproc.HeaderPrefiller) == a {
			moved = fmt.Sprintf("e%d", i+1)
		}
	}
	if moved != "e2" && moved != "e3" || waited < 200*time.Millisecond {
		t.Fatalf("the waiting request went to prefill %q after %v; want a moved decode engine after urgent_delay_s", second.Headers.Get(extproc.HeaderPrefiller), waited)
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

	if code, _ := srv.stop(t); code != 0 {
		t.Fatalf("serve exit %d", code)
	}
	out, code := runBin(t, "audit", "--decisions", decisions)
	if code != 0 {
		b, _ := os.ReadFile(decisions)
		t.Fatalf("audit exit %d:\n%s\nlog:\n%s", code, out, b)
	}
	for _, want := range []string{`"caller":"urgent","reason":"request`, `"caller":"repair"`, `"engine":"` + moved + `","event":"role"`} {
		if b, _ := os.ReadFile(decisions); !strings.Contains(string(b), want) {
			t.Fatalf("the decision log lacks %s:\n%s", want, b)
		}
	}
	t.Logf("audit: %s", strings.TrimSpace(out))
}
