package discovery

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseEndpoints(t *testing.T) {
	eps, err := ParseEndpoints([]byte(`
endpoints:
  - {name: p1, address: 10.0.0.1, port: 8000, labels: {llm-d.ai/role: prefill}}
  - {name: d1, address: "engine-d1:9000"}
  - {name: v6, address: "fd00::1", port: 8000}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 3 || eps[0].Address != "10.0.0.1:8000" || eps[0].Labels["llm-d.ai/role"] != "prefill" || eps[1].Address != "engine-d1:9000" || eps[2].Address != "[fd00::1]:8000" {
		t.Fatalf("%+v", eps)
	}
	if eps, err := ParseEndpoints(nil); err != nil || len(eps) != 0 {
		t.Fatalf("empty file: %v %v", eps, err)
	}
	for src, want := range map[string]string{
		"endpoints: [{name: a}]":                          "endpoints[0] (a): no address",
		"endpoints: [{address: 10.0.0.1}]":                "endpoints[0]: no name",
		"endpoints: [{name: a, address: x, port: 70000}]": "port 70000 out of range",
		"endpoints: [{name: a, address: x, weight: 3}]":   "field weight not found",
		"endpoints: {name: a}":                            "cannot unmarshal",
	} {
		if _, err := ParseEndpoints([]byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", src, err, want)
		}
	}
}

// The watcher follows the file through an atomic rename and a ConfigMap-style symlink swap;
// a broken file keeps the membership and says why; the directory's other files are noise.
func TestFileWatcher(t *testing.T) {
	cfg, f := testFleet(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	write := func(name, body string) { // write elsewhere, rename over: an atomic replace
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("endpoints.yaml", "endpoints: [{name: p1, address: 10.0.0.1, port: 8000, labels: {llm-d.ai/role: prefill}}]\n")
	reads := make(chan FileStatus, 64)
	w := &File{Path: path, Resync: time.Hour, Source: NewSource(SourceFile, cfg), Fleet: f, Now: time.Now,
		Log: slog.New(slog.DiscardHandler), OnRead: func(s FileStatus) { reads <- s }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	// next waits for a read whose status satisfies ok (reads of intermediate states pass by).
	next := func(what string, ok func(FileStatus) bool) FileStatus {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case s := <-reads:
				if ok(s) {
					return s
				}
			case <-timeout:
				t.Fatalf("no read with %s; fleet %v", what, members(f))
			}
		}
	}
	has := func(want ...string) func(FileStatus) bool {
		return func(FileStatus) bool { return slices.Equal(members(f), want) }
	}
	next("p1 added", has("c1@10.9.0.1:8000:prefill", "p1@10.0.0.1:8000:prefill"))

	write("endpoints.yaml", "endpoints: [{name: p1, address: 10.0.0.1, port: 8000, labels: {llm-d.ai/role: prefill}}, {name: d1, address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: decode}}]\n")
	next("d1 added", has("c1@10.9.0.1:8000:prefill", "p1@10.0.0.1:8000:prefill", "d1@10.0.0.2:8000:decode"))

	write("endpoints.yaml", "endpoints: [{name: p1, adress: 10.0.0.1}]\n")
	s := next("the parse error", func(s FileStatus) bool { return s.Error != "" })
	if !strings.Contains(s.Error, "adress") || len(members(f)) != 3 {
		t.Fatalf("broken file: %+v, fleet %v", s, members(f))
	}

	// A ConfigMap volume: the file is a symlink through ..data, swapped to a new directory.
	swap := func(gen, body string) {
		d := filepath.Join(dir, "..gen"+gen)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "endpoints.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..gen"+gen, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap("1", "endpoints: [{name: d1, address: 10.0.0.2, port: 8000, labels: {llm-d.ai/role: decode}}]\n")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/endpoints.yaml", path); err != nil {
		t.Fatal(err)
	}
	next("p1 removed", has("c1@10.9.0.1:8000:prefill", "d1@10.0.0.2:8000:decode"))
	swap("2", "endpoints: []\n")
	next("every file engine removed", has("c1@10.9.0.1:8000:prefill"))
	if s := w.Status(); s.Error != "" || s.Engines != 0 || s.Read.IsZero() {
		t.Fatalf("status %+v", s)
	}
}
