package admin

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
)

// A web page open in the operator's browser cannot drive the fleet (docs/security.md, "The admin
// API"): a cross-origin form or fetch that would change something is refused 403 before its
// route runs, whether the browser says so with Sec-Fetch-Site or only with Origin; the API's own
// page (same origin), and clients that are no browser (no such header), are served. A body
// that is not declared JSON — what a form or a text/plain fetch sends without asking the site
// first — is refused 415. Each refusal is counted and logged once per client and reason.
func TestCrossOriginCallsChangeNothing(t *testing.T) {
	fx := newFixture(t, "")
	var logs logbuf.Buffer
	reg := prometheus.NewRegistry()
	o := fx.admin.o
	o.Logger, o.Registerer = slog.New(slog.NewTextHandler(&logs, nil)), reg
	a := New(o)
	srv := httptest.NewServer(a)
	defer srv.Close()
	send := func(method, path, body string, header map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	evil := map[string]string{"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"}
	fetch := map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}
	for _, c := range []struct {
		method, path, body string
		header             map[string]string
	}{
		{"POST", "/narwhal/engines/e1/drain", "", evil},
		{"POST", "/narwhal/engines/e1/drain", "", fetch},
		{"POST", "/narwhal/engines", `{"id": "x1", "address": "203.0.113.9:8000", "role": "prefill"}`, fetch},
		{"POST", "/narwhal/engines", `{"id": "x1", "address": "203.0.113.9:8000", "role": "prefill"}`, evil},
		{"DELETE", "/narwhal/engines/e1", "", fetch},
		{"POST", "/narwhal/advise", `{"prefill": 1, "decode": 3}`, evil},
	} {
		if code, body := send(c.method, c.path, c.body, c.header); code != 403 || !strings.Contains(body, "cross-origin") {
			t.Errorf("%s %s %v: %d %s, want 403", c.method, c.path, c.header, code, body)
		}
	}
	// A text/plain or form body from no browser at all is refused too: the API reads JSON only.
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
		code, body := send("POST", "/narwhal/engines", `{"id": "x1", "address": "203.0.113.9:8000"}`, map[string]string{"Content-Type": ct})
		if code != 415 || !strings.Contains(body, "Content-Type: application/json") {
			t.Errorf("Content-Type %q: %d %s, want 415", ct, code, body)
		}
	}
	if _, ok := fx.fleet.Engine("x1"); ok {
		t.Fatal("a refused call added an engine")
	}
	if e, _ := fx.fleet.Engine("e1"); e.Lifecycle != fleet.Active {
		t.Fatalf("a refused call drained e1: %+v", e)
	}
	// Reads stay open to any page (the page itself, Prometheus); same-origin and non-browser
	// changes are served.
	if code, _ := send("GET", "/narwhal/state", "", map[string]string{"Sec-Fetch-Site": "cross-site"}); code != 200 {
		t.Errorf("a cross-site read: %d", code)
	}
	if code, body := send("POST", "/narwhal/engines/e1/drain", "", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": srv.URL}); code != 200 {
		t.Errorf("same origin: %d %s", code, body)
	}
	if code, body := send("POST", "/narwhal/engines/e1/undrain", "", map[string]string{"Origin": srv.URL}); code != 409 && code != 200 {
		t.Errorf("an older browser's same-origin call (Origin, no Sec-Fetch-Site): %d %s", code, body)
	}
	if code, body := send("POST", "/narwhal/engines", `{"id": "x2", "address": "127.0.0.1:8100"}`, map[string]string{"Content-Type": "application/json; charset=utf-8"}); code != 201 {
		t.Errorf("curl's JSON: %d %s", code, body)
	}
	count := func(reason string) float64 {
		var m dto.Metric
		if err := a.refused.WithLabelValues(reason).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	if got := count("origin"); got != 6 {
		t.Errorf("narwhal_admin_refused_total{reason=origin} %v, want 6", got)
	}
	if got := count("media_type"); got != 4 {
		t.Errorf("narwhal_admin_refused_total{reason=media_type} %v, want 4", got)
	}
	if n := strings.Count(logs.String(), "admin: call refused"); n != 2 {
		t.Errorf("%d refusal lines for one client and two reasons, want 2:\n%s", n, logs.String())
	}
}

// DNS rebinding: a page whose own name resolves to the admin listener's address reaches it as
// same-origin, with that name as Host. Only loopback names, IP addresses and admin.hosts are
// served; any other Host is refused 421 before any route, reads included.
func TestOnlyItsHostsAreServed(t *testing.T) {
	fx := newFixture(t, "")
	o := fx.admin.o
	o.Config.Admin.Hosts = []string{"narwhal.llm.svc"}
	srv := httptest.NewServer(New(o))
	defer srv.Close()
	for host, want := range map[string]int{
		"127.0.0.1:9090":         200,
		"[::1]:9090":             200,
		"10.0.0.7:9090":          200, // the kubelet's probe, Prometheus by pod IP
		"localhost:9090":         200,
		"LOCALHOST.":             200,
		"app.localhost":          200,
		"narwhal.llm.svc:9090":   200,
		"Narwhal.LLM.svc":        200,
		"evil.example:9090":      421,
		"evil.example":           421,
		"127.0.0.1.evil.example": 421,
		"narwhal.llm.svc.evil":   421,
	} {
		for _, c := range []struct{ method, path string }{{"GET", "/narwhal/state"}, {"POST", "/narwhal/engines/e1/pin"}} {
			req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%s %s with Host %q: %d, want %d", c.method, c.path, host, resp.StatusCode, want)
			}
		}
	}
}

// admin.token_file is read again when it changes, as the certificates are: a rotated Secret
// takes effect at the next call; a change that holds no usable token keeps the last good one.
// A call refused for its token is logged (once per client), never with the token.
func TestTokenFileRotates(t *testing.T) {
	fx := newFixture(t, "")
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	write := func(tok string) {
		t.Helper()
		// As Kubernetes updates a Secret: a new file renamed over the old.
		tmp := filepath.Join(dir, "token.new")
		if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	first, second := strings.Repeat("a", 32), strings.Repeat("b", 40)
	write(first)
	var logs logbuf.Buffer
	o := fx.admin.o
	o.Config.Admin.Token, o.Config.Admin.TokenFile = first, file
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	srv := httptest.NewServer(New(o))
	defer srv.Close()
	pin := func(tok string) int {
		t.Helper()
		code, _ := call(t, "POST", srv.URL+"/narwhal/engines/e1/pin", tok, "")
		return code
	}
	if pin(first) != 200 || pin(second) != 401 {
		t.Fatal("the first token is not the one served")
	}
	write(second)
	if pin(first) != 401 || pin(second) != 200 {
		t.Fatal("the rotated token did not replace the first")
	}
	write("short")
	if pin(second) != 200 || pin("short") != 401 {
		t.Fatal("a weak token replaced the last good one")
	}
	if !strings.Contains(logs.String(), "admin.token_file changed but holds no usable token") {
		t.Errorf("the unusable change is not logged:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "admin: call refused") || !strings.Contains(logs.String(), "reason=token") {
		t.Errorf("refused calls are not logged:\n%s", logs.String())
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if pin(second) != 200 {
		t.Fatal("a removed token file dropped the last good token")
	}
	for _, tok := range []string{first, second, "short"} {
		if strings.Contains(logs.String(), tok) {
			t.Fatalf("a token is in the log:\n%s", logs.String())
		}
	}

	// A rotation between serve's read of the file and the server's first call is not missed.
	write(first)
	o.Config.Admin.Token = first
	late := httptest.NewServer(New(o))
	defer late.Close()
	write(second)
	if code, _ := call(t, "POST", late.URL+"/narwhal/engines/e1/pin", first, ""); code != 401 {
		t.Errorf("the token replaced before the first call still passes: %d", code)
	}
	if code, _ := call(t, "POST", late.URL+"/narwhal/engines/e1/pin", second, ""); code != 200 {
		t.Errorf("the token written before the first call: %d", code)
	}

	// A token file that never held a usable token authorizes nothing: it fails closed.
	write("short")
	o.Config.Admin.Token = ""
	closed := httptest.NewServer(New(o))
	defer closed.Close()
	for _, tok := range []string{"", "short"} {
		if code, _ := call(t, "POST", closed.URL+"/narwhal/engines/e1/pin", tok, ""); code != 401 {
			t.Errorf("no usable token, call with %q: %d, want 401", tok, code)
		}
	}
}

// A slow client cannot hold the admin listener (docs/security.md): a request that announces a
// body and sends none, headers sent a byte at a time, and an idle keep-alive connection are
// each closed by the server once their limit passes, and the probes answer all the while.
// (Limits shortened here; DefaultLimits are what serve uses.)
func TestSlowClientsAreClosed(t *testing.T) {
	fx := newFixture(t, "")
	lim := Limits{ReadHeader: 200 * time.Millisecond, Read: 400 * time.Millisecond, Write: time.Second, Idle: 300 * time.Millisecond, MaxHeaderBytes: 4 << 10}
	srv := httptest.NewUnstartedServer(fx.admin)
	srv.Config = lim.HTTPServer(fx.admin, nil)
	srv.Start()
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	dial := func(first string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, first); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// closed reports whether the server closes c (EOF or a reset) before the deadline, reading
	// whatever answer comes first.
	closed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
	holders := []net.Conn{
		dial("POST /narwhal/engines HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"),
		dial("POST /narwhal/engines/e1/drain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n"),
		dial("GET /narwhal/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "),
	}
	idle := dial("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	for i := 0; i < 50; i++ {
		dial("GET /narwhal/state HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
	}
	if code, _ := call(t, "GET", srv.URL+"/healthz", "", ""); code != 200 {
		t.Fatalf("a probe among slow clients: %d", code)
	}
	for i, c := range append(holders, idle) {
		if !closed(c) {
			t.Errorf("connection %d is still open after its limit", i)
		}
	}
	big := dial("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + strings.Repeat("x", 16<<10) + "\r\n\r\n")
	br := bufio.NewReader(big)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 kB of headers against a 4 kB limit: %d", resp.StatusCode)
	}
	if d := DefaultLimits; d.Read <= 0 || d.Write <= 0 || d.Idle <= 0 || d.ReadHeader <= 0 || d.MaxHeaderBytes <= 0 || d.Read > 30*time.Second {
		t.Errorf("DefaultLimits %+v: every limit set, a request within 30 s", d)
	}
}
