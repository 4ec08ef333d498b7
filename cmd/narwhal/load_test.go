package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/load"
)

// narwhal load plays Envoy for a running narwhal serve: every request of a synthetic workload
// goes through Narwhal's ext_proc server (its offers count them) to the engines and back, in
// both request body modes; stdout is the summary, stderr the progress lines with the split; the
// JSON report agrees. Without a narwhal to talk to it says so and exits 1; a workload flag
// error is a usage error.
func TestLoadCommand(t *testing.T) {
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	cfgYAML := e2eConfig(anyPort, anyPort, anyPort, engines)
	cfg := writeConfig(t, cfgYAML)
	admin, extproc, _ := start(t, "serve", "--config", cfg).serving(t)
	waitFor(t, admin, 10*time.Second, "four active engines", allActive(4))

	var sent atomic.Int64
	t.Run("modes", func(t *testing.T) { // both at once; the group waits for them
		for _, mode := range []string{"BUFFERED", "FULL_DUPLEX_STREAMED"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				report := filepath.Join(t.TempDir(), "load.json")
				var stdout, stderr bytes.Buffer
				code := runBinTo(t, &stdout, &stderr, "load", "--config", cfg, "--extproc", extproc, "--admin", "http://"+admin,
					"--body-mode", mode, "--synthetic", "step", "--factor", "1", "--synthetic-rate", "20", "--synthetic-duration-s", "3",
					"--every-s", "1", "--report", report)
				if code != 0 {
					t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
				}
				var sum load.Summary
				b, err := os.ReadFile(report)
				if err != nil || json.Unmarshal(b, &sum) != nil {
					t.Fatalf("report %v: %s", err, b)
				}
				if sum.Sent < 40 || sum.OK != sum.Sent || sum.Failed != 0 || sum.Met == 0 || sum.TTFT == nil || sum.TTFT.P50 <= 0 {
					t.Fatalf("summary %+v", sum)
				}
				sent.Add(int64(sum.Sent))
				if want := fmt.Sprintf("sent %d, answered %d (ok %d)", sum.Sent, sum.Sent, sum.Sent); !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
				if !strings.Contains(stderr.String(), "request body "+mode) || !strings.Contains(stderr.String(), "split 2P/2D") {
					t.Errorf("stderr lacks the mode or the split:\n%s", stderr.String())
				}
			})
		}
	})
	// Every request went through Narwhal's ext_proc server: the router counted an offer for each.
	if st, err := getState(admin); err != nil || st.Counters.Offers < uint64(sent.Load()) {
		t.Fatalf("offers %d for %d requests sent (%v)", st.Counters.Offers, sent.Load(), err)
	}

	// No narwhal at the address: a clear error, exit 1.
	var stdout, stderr bytes.Buffer
	code := runBinTo(t, &stdout, &stderr, "load", "--config", cfg, "--extproc", "127.0.0.1:1", "--admin", "http://127.0.0.1:1",
		"--wait-s", "0.3", "--synthetic", "step", "--synthetic-duration-s", "1")
	if code != 1 || !strings.Contains(stderr.String(), "narwhal is not ready after") {
		t.Errorf("no narwhal: exit %d\n%s", code, stderr.String())
	}
	if _, code := runBin(t, "load", "--synthetic", "nope"); code != 2 {
		t.Errorf("an unknown synthetic kind: exit %d, want 2", code)
	}
}

// runWorkload is the workload `make run` plays: the flags of scripts/run-local.sh's workload=(...).
func runWorkload(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../scripts/run-local.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^workload=\((.*)\)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("run-local.sh has no workload=(...) line")
	}
	return strings.Fields(string(m[1]))
}

// The workload `make run` plays makes the controller act within its first two minutes, and the
// move pays: narwhal sim, on the same workload and the embedded default, shows a role change by
// 120 s and an attainment above the fleet left alone (the README's first look promises both).
func TestRunWorkloadMoves(t *testing.T) {
	report := filepath.Join(t.TempDir(), "r.json")
	args := append([]string{"sim"}, runWorkload(t)...)
	args = append(args, "--policy", "narwhal,static", "--window-s", "30", "--report", report)
	if out, code := runBin(t, args...); code != 0 {
		t.Fatalf("sim %v: exit %d\n%s", args, code, out)
	}
	var rep struct {
		Policies []struct {
			Policy        string  `json:"policy"`
			SLOAttainment float64 `json:"slo_attainment"`
			Windows       []struct {
				StartS  float64 `json:"start_s"`
				Changes int     `json:"role_changes"`
			} `json:"windows"`
		} `json:"policies"`
	}
	if b, err := os.ReadFile(report); err != nil || json.Unmarshal(b, &rep) != nil || len(rep.Policies) != 2 {
		t.Fatalf("report %v: %s", err, b)
	}
	nw, static := rep.Policies[0], rep.Policies[1]
	first := -1.0
	for _, w := range nw.Windows {
		if w.Changes > 0 {
			first = w.StartS
			break
		}
	}
	if first < 0 || first >= 120 || nw.SLOAttainment < static.SLOAttainment+0.01 {
		t.Fatalf("the first role change in the window from %g s (want before 120 s); attainment %.3f against %.3f left alone", first, nw.SLOAttainment, static.SLOAttainment)
	}
}
