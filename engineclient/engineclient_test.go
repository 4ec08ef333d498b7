package engineclient

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// The probe wants a 2xx from the health path, resolves a host name to IP:port (and returns it
// also when the check fails), and fails against a closed server or an address without a port.
func TestHTTPProber(t *testing.T) {
	var status int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
	}))
	defer srv.Close()
	p := &HTTPProber{Client: srv.Client(), Path: "/health"}
	addr := strings.TrimPrefix(srv.URL, "http://")
	port := addr[strings.LastIndexByte(addr, ':'):]
	for _, tc := range []struct {
		status  int
		address string
		ok      bool
	}{
		{200, addr, true},
		{503, addr, false},
		{204, "localhost" + port, true}, // a host name resolves to IP:port
	} {
		mu.Lock()
		status = tc.status
		mu.Unlock()
		ap, err := p.Probe(context.Background(), tc.address)
		if (err == nil) != tc.ok {
			t.Fatalf("%d from %s: err %v", tc.status, tc.address, err)
		}
		if !ap.Addr().IsLoopback() || ap.Port() == 0 {
			t.Fatalf("%s resolved to %v", tc.address, ap)
		}
	}
	srv.Close()
	if _, err := p.Probe(context.Background(), addr); err == nil {
		t.Fatal("a closed server answered a probe")
	}
	if _, err := p.Probe(context.Background(), "no-port"); err == nil {
		t.Fatal("an address without a port was probed")
	}
}

// An engine with a probe target of its own (engines[].health) is probed there — its engine's
// port behind a sidecar that answers /health itself, or another path — and the address
// returned is still the engine's, where placements go.
func TestHTTPProberTargets(t *testing.T) {
	sidecar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})) // 200 to anything
	defer sidecar.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable) // its own /health: the engine is down
	}))
	defer engine.Close()
	sAddr, eAddr := strings.TrimPrefix(sidecar.URL, "http://"), strings.TrimPrefix(engine.URL, "http://")
	ePort, _ := strconv.Atoi(eAddr[strings.LastIndexByte(eAddr, ':')+1:])
	p := &HTTPProber{Client: http.DefaultClient, Path: "/health"}
	if _, err := p.Probe(context.Background(), sAddr); err != nil {
		t.Fatalf("the sidecar's own /health: %v", err)
	}
	p.Targets = map[string]config.EngineHealth{sAddr: {Port: ePort}}
	ap, err := p.Probe(context.Background(), sAddr)
	if err == nil || !strings.Contains(err.Error(), "/health answered 503") {
		t.Fatalf("probed at the engine's port: %v", err)
	}
	if ap.String() != sAddr {
		t.Fatalf("the probe returned %v, want the engine's address %s", ap, sAddr)
	}
	p.Targets = map[string]config.EngineHealth{sAddr: {Port: ePort, Path: "/v1/models"}}
	if _, err := p.Probe(context.Background(), sAddr); err != nil {
		t.Fatalf("another path at the engine's port: %v", err)
	}
}

// SGLangSwitch reads SGLang's answers: a success, a refusal (success false), a failed rebuild
// (500), a server without the endpoint, and an answer naming another role.
func TestSGLangSwitch(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   string // "" for a success
	}{
		{200, `{"success": true, "message": "ok", "old_role": "decode", "new_role": "prefill"}`, ""},
		{400, `{"success": false, "message": "the engine is not idle"}`, "refused (400 Bad Request): the engine is not idle"},
		{500, `{"success": false, "message": "rebuild failed"}`, "refused (500 Internal Server Error): rebuild failed"},
		{404, `<html>not found</html>`, "answered 404 Not Found: <html>not found</html>"},
		{200, `{"success": true, "message": "ok", "old_role": "decode", "new_role": "decode"}`, "the engine says it is now decode, not prefill"},
	} {
		var got string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b := make([]byte, 100)
			n, _ := r.Body.Read(b)
			got = r.Method + " " + r.URL.Path + " " + string(b[:n])
			w.WriteHeader(c.status)
			_, _ = w.Write([]byte(c.body))
		}))
		msg, err := SGLangSwitch{}.Switch(context.Background(), strings.TrimPrefix(srv.URL, "http://"), fleet.Prefill)
		srv.Close()
		if got != `POST /pd_role_switch {"new_role":"prefill"}` {
			t.Errorf("the request: %q", got)
		}
		switch {
		case c.want == "" && (err != nil || msg != "decode -> prefill: ok"):
			t.Errorf("%s: %q %v", c.body, msg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}

// ResolveFleet records the address of every engine whose host name resolves, and leaves the
// others unresolved (they take no placements), saying so.
func TestResolveFleet(t *testing.T) {
	cfg := config.Default()
	cfg.Engines = []config.Engine{
		{ID: "a", Address: "localhost:8000", Role: "prefill", Profile: config.DefaultProfileName},
		{ID: "b", Address: "no-such-host.invalid:8000", Role: "decode", Profile: config.DefaultProfileName},
	}
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	ResolveFleet(context.Background(), f, 2*time.Second, slog.New(slog.NewTextHandler(&logs, nil)))
	if a, _ := f.Engine("a"); a.Addr != "127.0.0.1:8000" && a.Addr != "[::1]:8000" {
		t.Errorf("a resolved to %q", a.Addr)
	}
	if b, _ := f.Engine("b"); b.Addr != b.Address || !strings.Contains(logs.String(), "engine=b") {
		t.Errorf("b = %q; log %s", b.Addr, logs.String())
	}
}
