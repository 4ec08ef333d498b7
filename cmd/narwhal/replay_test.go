package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/admin"
	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/sim"
	"github.com/narwhal-llm/narwhal/wire"
)

// TestTraceReplay replays the first 2,000 requests of the Azure conversation trace, time
// compressed 10× (about 47 requests/s, about 80% of the two prefill engines' capacity), through the
// Envoy-faithful test gateway and the real narwhal serve to four real enginesim processes (2
// prefill, 2 decode, the default profile). Output lengths are capped at 16 tokens to keep the
// two cores for the data path. Every request completes or is rejected with a contract status;
// placements are disaggregated with the prefiller header; at the end the accounting is
// conserved and every gauge is back to zero.
func TestTraceReplay(t *testing.T) {
	const n, speedup, maxOut = 2000, 10.0, 16
	reqs, err := sim.LoadTrace("../../sim/testdata/azure-2023-conv.csv.gz", n)
	if err != nil {
		t.Fatal(err)
	}
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	engine := map[string]bool{}
	for _, a := range engines {
		engine[a] = true
	}
	cfg := e2eConfig(anyPort, anyPort, anyPort, engines)
	adminAddr, extprocAddr, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, adminAddr, 10*time.Second, "serve up", func(s stateView) bool { return len(s.Engines) == 4 })

	mode := gateway.Mode{
		RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, AllowModeOverride: true,
		MessageTimeout: 40 * time.Second, ReceivingNamespaces: []string{"envoy.lb"},
	}
	gw, hs := envoytest.StartGateway(t, extprocAddr, mode)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}

	type result struct {
		status int
		code   string
	}
	results := make([]result, len(reqs))
	var wg sync.WaitGroup
	begin := time.Now()
	for i, q := range reqs {
		at := begin.Add(time.Duration(q.ArrivalS / speedup * float64(time.Second)))
		time.Sleep(time.Until(at))
		prompt := strings.Repeat("word", max(1, q.InputTokens)) // enginesim: 4 bytes a token
		out := min(max(1, q.OutputTokens), maxOut)
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":%d,"stream":true}`, prompt, out)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			results[i].status = resp.StatusCode
			if resp.StatusCode != 200 {
				var e struct{ Error struct{ Code string } }
				_ = json.Unmarshal(b, &e)
				results[i].code = e.Error.Code
			} else if !strings.Contains(string(b), "[DONE]") {
				t.Errorf("request %d: stream ended without [DONE]", i)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(begin)

	byStatus := map[string]int{}
	for i, r := range results {
		key := fmt.Sprint(r.status)
		switch {
		case r.status == 200:
		case (r.status == 429 && (r.code == "waiting_set_full" || r.code == "predicted_slo_miss")) ||
			(r.status == 503 && r.code == "no_capacity") || (r.status == 504 && r.code == "wait_timeout"):
			key += " " + r.code
		default:
			t.Errorf("request %d: status %d code %q is not a contract outcome", i, r.status, r.code)
		}
		byStatus[key]++
	}
	placed, local := 0, 0
	for _, o := range gw.Outcomes() {
		if o.Status != 200 {
			continue
		}
		placed++
		// The role controller may move engines between the roles while the trace plays; a
		// decode engine may prefill a request itself (router.local_prefill: auto), llm-d's
		// decode-only path: no prefiller.
		switch p := o.Placement.Get(wire.HeaderPrefiller); o.Placement.Get(wire.HeaderPlacement) {
		case "disaggregated":
			if !engine[p] || !engine[o.Upstream] || p == o.Upstream {
				t.Fatalf("placement %v to %s", o.Placement, o.Upstream)
			}
		case "aggregate":
			if p != "" || !engine[o.Upstream] {
				t.Fatalf("placement %v to %s", o.Placement, o.Upstream)
			}
			local++
		default:
			t.Fatalf("placement %v to %s", o.Placement, o.Upstream)
		}
	}

	resp, err := http.Get("http://" + adminAddr + "/narwhal/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st admin.State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	// Local sizing was checked against the engines' usage.prompt_tokens for the model.
	if len(st.Sizing) != 1 || st.Sizing[0].Model != "m" || st.Sizing[0].Samples < 1000 {
		t.Fatalf("sizing in /narwhal/state: %+v", st.Sizing)
	}
	t.Logf("sizing: %+v", st.Sizing[0])
	for _, d := range st.Decisions {
		if len(d.Moves) > 0 || d.Outcome == "blocked" {
			t.Logf("decision %d at %.1fs %s %s: %s %v", d.Seq, d.TimeS, d.Caller, d.Outcome, d.Reason, d.Moves)
		}
	}
	c, r := st.Counters, st.Retained
	t.Logf("%d requests in %v (%.1f/s offered): %v, %d prefilled locally; counters %+v", len(reqs), elapsed.Round(time.Millisecond), float64(len(reqs))/elapsed.Seconds(), byStatus, local, c)
	snap := router.Snapshot{Counters: c, Retained: r}
	switch {
	case c.Offers != uint64(len(reqs)):
		t.Fatalf("offers %d, sent %d", c.Offers, len(reqs))
	case snap.Conserved() != "":
		t.Fatalf("not conserved: %s", snap.Conserved())
	case r.Waiting+r.Prefilling+r.Decoding != 0 || r.WaitingTokens+r.AwaitingOutputTokens != 0:
		t.Fatalf("gauges not back to zero: %+v", r)
	case c.Completed != uint64(byStatus["200"]) || uint64(placed) != c.Completed:
		t.Fatalf("completed %d, 200s %d, placed %d", c.Completed, byStatus["200"], placed)
	case c.Dispatched.Aggregate != c.Dispatched.Local || uint64(local) > c.Dispatched.Local: // no fallback engine here
		t.Fatalf("dispatched %+v, %d answered locally", c.Dispatched, local)
	case c.Completed < uint64(len(reqs))*9/10:
		t.Fatalf("only %d of %d completed", c.Completed, len(reqs))
	}
}
