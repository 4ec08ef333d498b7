package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// narwhal sim: a synthetic workload under two policies writes a report and a decision log whose
// every line carries its policy, and the log audits clean; a bad trace row is an error naming
// its line; bad flags are usage errors.
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	report, decisions := filepath.Join(dir, "report.json"), filepath.Join(dir, "decisions.jsonl")
	out, code := runBin(t, "sim", "--synthetic", "phases", "--synthetic-rate", "20", "--synthetic-duration-s", "300", "--phase-s", "100",
		"--policy", "narwhal,static,static:best", "--report", report, "--decisions", decisions)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	var rep struct {
		Trace    string `json:"trace"`
		Policies []struct {
			Policy          string  `json:"policy"`
			Requests        int     `json:"requests"`
			SLOAttainment   float64 `json:"slo_attainment"`
			GuardViolations int     `json:"guard_violations"`
		} `json:"policies"`
	}
	b, err := os.ReadFile(report)
	if err != nil || json.Unmarshal(b, &rep) != nil || len(rep.Policies) != 3 || rep.Trace != "synthetic:phases" {
		t.Fatalf("report %v: %s", err, b)
	}
	for _, p := range rep.Policies {
		if p.Requests == 0 || p.SLOAttainment <= 0 || p.GuardViolations != 0 {
			t.Errorf("policy %+v", p)
		}
		// Stdout is the table, a row per policy with its attainment; no JSON.
		if row := p.Policy + " "; !strings.Contains(out, "\n"+row) || !strings.Contains(out, fmt.Sprintf("%.3f", p.SLOAttainment)) {
			t.Errorf("stdout has no row for %s at %.3f:\n%s", p.Policy, p.SLOAttainment, out)
		}
	}
	if strings.Contains(out, `"policies"`) {
		t.Errorf("stdout carries the JSON report:\n%s", out)
	}
	f, err := os.Open(decisions)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	lines := 0
	for sc.Scan() {
		lines++
		if !strings.HasPrefix(sc.Text(), `{"policy":"narwhal",`) {
			t.Fatalf("line %d has no policy: %s", lines, sc.Text())
		}
	}
	if lines < 3 {
		t.Fatalf("%d decision log lines", lines)
	}
	if out, code := runBin(t, "audit", "--decisions", decisions); code != 0 {
		t.Fatalf("audit of the sim's log: exit %d\n%s", code, out)
	}

	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("arrival_s,input_tokens,output_tokens\n0.5,100,10\n0.7,lots,10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := runBin(t, "sim", "--trace", bad); code != 1 || !strings.Contains(out, "line 3") {
		t.Fatalf("bad row: exit %d\n%s", code, out)
	}
	for _, args := range [][]string{
		{"sim"},
		{"sim", "--trace", bad, "--synthetic", "onoff"},
		{"sim", "--synthetic", "sawtooth"},
		{"sim", "--synthetic", "onoff", "--policy", "static:9"},
		{"sim", "--synthetic", "onoff", "--rate-scale", "0"},
	} {
		if out, code := runBin(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage)\n%s", args, code, out)
		}
	}
}
