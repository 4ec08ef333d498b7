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

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/wire"
)

// TestDiscoveryFileEndToEnd: narwhal serve with no engines in its config and an endpoints file
// in llm-d's layout. The fleet follows the file while requests are placed through the ext_proc
// server: engines listed join (probed, then placed on), an engine taken off the list leaves
// placement and EDS, and the admin API refuses to remove an engine the file owns.
func TestDiscoveryFileEndToEnd(t *testing.T) {
	_, engines := startEngines(t, "prefill", "decode", "prefill")
	dir := t.TempDir()
	endpoints := filepath.Join(dir, "endpoints.yaml")
	list := func(entries ...string) { // an atomic replace, as an operator's tooling would do it
		var b strings.Builder
		b.WriteString("endpoints:\n")
		for _, e := range entries {
			b.WriteString("  - " + e + "\n")
		}
		tmp := endpoints + ".tmp"
		if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, endpoints); err != nil {
			t.Fatal(err)
		}
	}
	entry := func(name, addr, role string) string {
		host, port, _ := strings.Cut(addr, ":")
		return fmt.Sprintf("{name: %s, address: %q, port: %s, labels: {llm-d.ai/role: %s}}", name, host, port, role)
	}
	list(entry("p1", engines[0], "prefill"), entry("d1", engines[1], "decode"))
	cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.3}
shutdown_grace_s: 1
state: {dir: %q}
discovery: {file: {path: %q}}
router: {local_prefill: off}
`, anyPort, anyPort, anyPort, filepath.Join(dir, "state"), endpoints)
	admin, extprocAddr, xdsAddr := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, admin, 10*time.Second, "p1 and d1 active", allActive(2))

	place := placer(t, extprocAddr)
	if p, d := place(); p != engines[0] || d != engines[1] {
		t.Fatalf("placed on %s/%s, want p1 %s and d1 %s", p, d, engines[0], engines[1])
	}

	eds := adsWatch(t, xdsAddr)
	list(entry("d1", engines[1], "decode"), entry("p2", engines[2], "prefill"))
	waitFor(t, admin, 10*time.Second, "p1 gone, p2 active", func(s stateView) bool {
		return len(s.Engines) == 2 && lifecycleOf(s, "p1") == "" && lifecycleOf(s, "p2") == "active"
	})
	if p, _ := place(); p != engines[2] {
		t.Fatalf("placed on prefill %s, want p2 %s", p, engines[2])
	}
	awaitEDS(t, eds, "p1 out of EDS, p2 in", func(g map[string]map[string]string) bool {
		_, p1 := g["narwhal-engines"]["p1"]
		return !p1 && g["narwhal-prefill"]["p2"] == "HEALTHY" && len(g["narwhal-engines"]) == 2
	})
	req, _ := http.NewRequest(http.MethodDelete, "http://"+admin+"/narwhal/engines/d1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("DELETE of a file engine: %s", resp.Status)
	}
	st, err := getStateAs[map[string]any](admin)
	if err != nil {
		t.Fatal(err)
	}
	file, _ := st["discovery"].(map[string]any)["file"].(map[string]any)
	if file["engines"] != 2.0 || file["path"] != endpoints {
		t.Fatalf("discovery state %v", st["discovery"])
	}
}

// placer returns a function that sends one streaming completion through the ext_proc server at
// addr (the Envoy-faithful client) and returns the prefill and decode engines it was placed on.
func placer(t *testing.T, addr string) func() (prefill, decode string) {
	client := envoytest.NewTestClient(t, addr, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: time.Minute})
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	return func() (string, string) {
		t.Helper()
		x := client.NewExchange(context.Background())
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":4,"stream":true}`)})
		if err != nil || res.LocalReply != nil {
			t.Fatalf("request: %+v %v", res, err)
		}
		return res.Headers.Get(wire.HeaderPrefiller), res.Headers.Get(wire.HeaderDestination)
	}
}
