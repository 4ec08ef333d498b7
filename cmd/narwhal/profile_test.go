package main

import (
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/enginesim"
)

// narwhal profile end to end: against an enginesim process it writes a block that narwhal
// validate accepts and an SVG; against an engine that fails mid-sweep it writes what it measured,
// says it is incomplete and exits 1; usage errors exit 2.
func TestProfileCommand(t *testing.T) {
	_, addr := startEngine(t, "decode")
	dir := t.TempDir()
	out, plot := filepath.Join(dir, "p.yaml"), filepath.Join(dir, "p.svg")
	log, code := runBin(t, "profile", "--engine", "http://"+addr, "--model", config.DefaultProfileName, "--name", "h200",
		"--out", out, "--plot", plot, "--budget-s", "8", "--max-prompt-tokens", "4096")
	if code != 0 || !strings.Contains(log, "prefill: 3") {
		t.Fatalf("profile: exit %d\n%s", code, log)
	}
	block, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, string(block)+"engines:\n- {id: p1, address: \"127.0.0.1:1\", role: prefill, profile: h200}\n- {id: d1, address: \"127.0.0.1:2\", role: decode, profile: h200}\n")
	if v, code := runBin(t, "validate", "--config", cfg); code != 0 {
		t.Fatalf("the block does not validate: %s\n%s", v, block)
	}
	svg, err := os.ReadFile(plot)
	if err != nil || xml.Unmarshal(svg, new(struct{})) != nil || !strings.Contains(string(svg), "<polyline") {
		t.Fatalf("the plot: %v\n%.300s", err, svg)
	}

	eng := enginesim.New(enginesim.Options{Profile: config.DefaultProfile(), Model: "m"})
	defer eng.Close()
	var calls atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" && calls.Add(1) > 8 {
			http.Error(w, `{"error":{"message":"engine overloaded","code":"internal"}}`, http.StatusInternalServerError)
			return
		}
		eng.ServeHTTP(w, r)
	}))
	defer failing.Close()
	partial := filepath.Join(dir, "partial.yaml")
	log, code = runBin(t, "profile", "--engine", failing.URL, "--model", "m", "--out", partial, "--budget-s", "8", "--max-prompt-tokens", "4096")
	block, _ = os.ReadFile(partial)
	if code != 1 || !strings.Contains(log, "cut short (what was measured is written)") || !strings.Contains(string(block), "# INCOMPLETE: prefill at") {
		t.Fatalf("a failing engine: exit %d\n%s\n%s", code, log, block)
	}

	for _, args := range [][]string{{"profile", "--model", "m"}, {"profile", "--engine", "10.0.0.1:8000", "--model", "m"}, {"profile", "--engine", "http://x:1", "--model", "m", "--name", "a b"}} {
		if log, code := runBin(t, args...); code != 2 {
			t.Errorf("%v: exit %d\n%s", args, code, log)
		}
	}
}
