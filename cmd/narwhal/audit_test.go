package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// narwhal audit: exit 0 and a summary for a clean log, exit 1 and one line per violation for a
// bad one, a clear error for a missing or malformed file.
func TestAuditCommand(t *testing.T) {
	head := `{"kind":"config","time_s":0,"controller":{"advisory":false,"min_prefill":1,"min_decode":1,"reactive":{"evidence_span_s":30,"evidence_min_arrivals":50,"evidence_max_span_s":120},"thresholds":{"cooldown_s":60,"dwell_s":120}}}
{"kind":"fleet","time_s":0,"event":"snapshot","engines":[{"id":"e1","role":"prefill","lifecycle":"active","pinned":false},{"id":"e2","role":"decode","lifecycle":"active","pinned":false},{"id":"e3","role":"decode","lifecycle":"active","pinned":false}]}
`
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.jsonl", head+`{"kind":"fleet","time_s":40,"event":"role","engine":"e3","from":"decode","to":"prefill","cause":"decision 1","decision":1}
{"kind":"decision","time_s":40,"seq":1,"caller":"regular","outcome":"moved","inputs":{"evidence_window":{"opened_at_s":0,"arrivals":80}},"moves":[{"engine":"e3","from":"decode","to":"prefill"}]}
`)
	bad := write("bad.jsonl", head+`{"kind":"fleet","time_s":10,"event":"role","engine":"e3","from":"decode","to":"prefill","cause":"decision 1","decision":1}
{"kind":"decision","time_s":10,"seq":1,"caller":"urgent","outcome":"moved","inputs":{"evidence_window":{"opened_at_s":0,"arrivals":3}},"moves":[{"engine":"e3","from":"decode","to":"prefill"}]}
`)
	if out, code := runBin(t, "audit", "--decisions", good); code != 0 || !strings.Contains(out, "1 decisions, 1 role changes (0 by operators), 0 violations") {
		t.Fatalf("good: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, "audit", "--decisions", bad); code != 1 || !strings.Contains(out, "line 4 (10.000s): evidence_window:") {
		t.Fatalf("bad: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, "audit", "--decisions", write("junk.jsonl", head+"{oops\n")); code != 1 || !strings.Contains(out, "line 3") {
		t.Fatalf("junk: exit %d\n%s", code, out)
	}
	if out, code := runBin(t, "audit"); code != 2 || !strings.Contains(out, "--decisions FILE is required") {
		t.Fatalf("no flag: exit %d\n%s", code, out)
	}
}
