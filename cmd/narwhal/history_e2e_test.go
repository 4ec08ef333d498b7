package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/history"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

func getHistory(t *testing.T, adminAddr, since string) (history.Document[decisionlog.Decision], int) {
	t.Helper()
	u := "http://" + adminAddr + "/narwhal/history"
	if since != "" {
		u += "?since=" + url.QueryEscape(since)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h history.Document[decisionlog.Decision]
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
	}
	return h, resp.StatusCode
}

// Issue 13, history in the process: narwhal serve samples the fleet every
// admin.history.interval_s into a ring of admin.history.samples; GET /narwhal/history serves
// them (an operator's drain shows in the samples after it), since a time, and never more than the
// ring holds; a bad since is a 400.
func TestServeHistory(t *testing.T) {
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	cfg := e2eConfig(anyPort, anyPort, anyPort, engines) + "admin: {history: {interval_s: 0.05, samples: 8, decisions: 4}}\n"
	adminAddr, _, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, adminAddr, 10*time.Second, "four active engines", allActive(4))
	if code, err := httpPost("http://" + adminAddr + "/narwhal/engines/e4/drain"); err != nil || code != 200 {
		t.Fatalf("drain: %d %v", code, err)
	}
	drained := time.Now()
	var h history.Document[decisionlog.Decision]
	if !poll.Within(10*time.Second, func() bool {
		h, _ = getHistory(t, adminAddr, "")
		n := len(h.Samples)
		return n == 8 && h.Samples[n-1].T.After(drained) && h.Samples[n-1].Engines[3].Lifecycle == "draining"
	}) {
		t.Fatalf("history: %d samples, capacity %+v", len(h.Samples), h.Capacity)
	}
	last := h.Samples[len(h.Samples)-1]
	if h.Capacity != (history.Capacity{Samples: 8, Decisions: 4}) || h.IntervalS != 0.05 || last.Prefill != 2 || last.Decode != 1 || len(last.Engines) != 4 || !last.Engines[3].Drained {
		t.Fatalf("history %+v, last sample %+v", h.Capacity, last)
	}
	for i := 1; i < len(h.Samples); i++ {
		if !h.Samples[i].T.After(h.Samples[i-1].T) {
			t.Fatalf("samples out of order at %d", i)
		}
	}
	since, _ := getHistory(t, adminAddr, h.Samples[5].T.Format(time.RFC3339Nano))
	if len(since.Samples) == 0 || !since.Samples[0].T.After(h.Samples[5].T) {
		t.Fatalf("since %v: %d samples", h.Samples[5].T, len(since.Samples))
	}
	if _, code := getHistory(t, adminAddr, "yesterday"); code != 400 {
		t.Fatalf("a bad since: %d", code)
	}
}
