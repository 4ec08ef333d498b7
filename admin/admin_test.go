package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type fixture struct {
	srv     *httptest.Server
	fleet   *fleet.Fleet
	admin   *Server
	metrics *Metrics
}

func newFixture(t *testing.T, token string) *fixture {
	t.Helper()
	c := config.Default()
	c.Admin.Token = token
	for i, role := range []string{"prefill", "prefill", "decode", "decode"} {
		c.Engines = append(c.Engines, config.Engine{
			ID: "e" + string(rune('1'+i)), Address: "127.0.0.1:800" + string(rune('1'+i)),
			Role: role, Profile: config.DefaultProfileName,
		})
	}
	f, err := fleet.New(c, t0)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, f, "test")
	a := New(Options{Config: c, Fleet: f, Gatherer: reg, Now: func() time.Time { return t0.Add(time.Minute) }, Start: t0})
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, fleet: f, admin: a, metrics: m}
}

func (fx *fixture) do(t *testing.T, method, path, token string) (int, string) {
	t.Helper()
	return call(t, method, fx.srv.URL+path, token, "")
}

// call makes one HTTP call (with a bearer token unless empty, a body unless empty) and returns
// the status and the body.
func call(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (fx *fixture) state(t *testing.T) State {
	t.Helper()
	code, body := fx.do(t, "GET", "/narwhal/state", "")
	if code != 200 {
		t.Fatalf("state: %d %s", code, body)
	}
	var st State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStateShape(t *testing.T) {
	fx := newFixture(t, "")
	code, body := fx.do(t, "GET", "/narwhal/state", "")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	// Every key of the contract's /narwhal/state is present, with the contract's nesting.
	for _, path := range []string{
		"time", "advisory", "split.prefill", "split.decode", "engines",
		"demand.short.arrivals_per_s", "demand.long.prompt_tokens_per_s", "demand.priced.output_tokens_per_s",
		"retained.samples", "retained.waiting", "retained.waiting_tokens", "retained.prefilling",
		"retained.awaiting_output_tokens", "retained.decoding",
		"counters.offers", "counters.invalid", "counters.admitted",
		"counters.overflow.waiting_set_full", "counters.overflow.predicted_slo_miss",
		"counters.overflow.fallback_busy", "counters.overflow.no_capacity", "counters.overflow.wait_timeout",
		"counters.dispatched.disaggregated", "counters.dispatched.aggregate",
		"counters.completed", "counters.failed", "counters.cancelled.waiting", "counters.cancelled.in_flight",
		"counters.first_token_timeouts",
		"evidence_window.open", "evidence_window.opened_at", "evidence_window.arrivals", "decisions",
	} {
		var v any = raw
		for _, k := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("%s: parent is not an object", path)
			}
			if v, ok = m[k]; !ok {
				t.Fatalf("state lacks %s", path)
			}
		}
	}
	if d, ok := raw["decisions"].([]any); !ok || len(d) != 0 {
		t.Fatalf("decisions = %v, want []", raw["decisions"])
	}
	e := raw["engines"].([]any)[0].(map[string]any)
	for _, k := range []string{"id", "address", "role", "lifecycle", "pinned", "role_since",
		"prefill_residents", "decode_residents", "busy_until_s", "correction"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("engine lacks %s: %v", k, e)
		}
	}
	st := fx.state(t)
	if st.Split != (Split{2, 2}) || len(st.Engines) != 4 || st.Engines[0].Lifecycle != "active" {
		t.Fatalf("state %+v", st)
	}
	if st.Time != "2026-01-01T00:01:00Z" || st.EvidenceWindow.OpenedAt != "2026-01-01T00:00:00Z" {
		t.Fatalf("times %q %q", st.Time, st.EvidenceWindow.OpenedAt)
	}
}

func TestEngineActions(t *testing.T) {
	fx := newFixture(t, "")
	steps := []struct {
		method, path string
		code         int
		check        func(st State) bool
	}{
		{"POST", "/narwhal/engines/e3/drain", 200, func(st State) bool {
			return st.Engines[2].Lifecycle == "draining" && st.Engines[2].Drained && st.Split == Split{2, 1}
		}},
		{"POST", "/narwhal/engines/e3/drain", 200, nil}, // idempotent
		{"POST", "/narwhal/engines/e3/undrain", 200, func(st State) bool {
			// held out until the health monitor readmits it
			return st.Engines[2].Lifecycle == "draining" && !st.Engines[2].Drained
		}},
		{"POST", "/narwhal/engines/e3/undrain", 409, nil},
		// e4 is the last live decode engine (e3 waits for its probes): its drain would leave the
		// decode pool under controller.min_decode, and is refused until forced.
		{"POST", "/narwhal/engines/e4/drain", 409, func(st State) bool {
			return st.Engines[3].Lifecycle == "active" && !st.Engines[3].Drained && st.Split == Split{2, 1}
		}},
		{"POST", "/narwhal/engines/e4/drain?force=false", 409, nil},
		{"POST", "/narwhal/engines/e4/drain?force=true", 200, func(st State) bool {
			return st.Engines[3].Lifecycle == "draining" && st.Engines[3].Drained && st.Split == Split{2, 0}
		}},
		{"POST", "/narwhal/engines/e1/pin", 200, func(st State) bool { return st.Engines[0].Pinned }},
		{"POST", "/narwhal/engines/e1/unpin", 200, func(st State) bool { return !st.Engines[0].Pinned }},
		{"POST", "/narwhal/engines/e9/drain", 404, nil},
		{"POST", "/narwhal/engines/e1/explode", 404, nil},
		{"GET", "/narwhal/engines/e1/drain", 405, nil},
		{"DELETE", "/narwhal/engines/e1/pin", 405, nil},
		{"POST", "/narwhal/state", 405, nil},
		{"GET", "/no/such/path", 404, nil},
	}
	for _, s := range steps {
		code, body := fx.do(t, s.method, s.path, "")
		if code != s.code {
			t.Fatalf("%s %s: %d %s, want %d", s.method, s.path, code, body, s.code)
		}
		if code >= 400 && !strings.Contains(body, `"error"`) { // a 404 or 405 of no route too
			t.Fatalf("%s %s: error body %q is not an error object", s.method, s.path, body)
		}
		if code == 409 && strings.Contains(s.path, "e4/drain") {
			for _, want := range []string{`"below_floor"`, "draining e4 would leave 0 live decode engines, under the floor of 1", "controller.min_decode", "/narwhal/engines/e4/drain?force=true"} {
				if !strings.Contains(body, want) {
					t.Fatalf("%s %s: %s, want it to say %s", s.method, s.path, body, want)
				}
			}
		}
		if s.check != nil && !s.check(fx.state(t)) {
			t.Fatalf("%s %s: state after is %+v", s.method, s.path, fx.state(t))
		}
	}
}

func TestToken(t *testing.T) {
	fx := newFixture(t, "s3cret")
	for _, tok := range []string{"", "wrong", "s3cret2", "s3cre"} {
		if code, _ := fx.do(t, "POST", "/narwhal/engines/e1/drain", tok); code != 401 {
			t.Fatalf("token %q: %d, want 401", tok, code)
		}
	}
	if e, _ := fx.fleet.Engine("e1"); e.Lifecycle != fleet.Active {
		t.Fatal("an unauthorized call changed the fleet")
	}
	if code, _ := fx.do(t, "POST", "/narwhal/engines/e1/drain", "s3cret"); code != 200 {
		t.Fatalf("right token: %d", code)
	}
	// Reads need no token.
	if code, _ := fx.do(t, "GET", "/narwhal/state", ""); code != 200 {
		t.Fatalf("state without token: %d", code)
	}
}

func TestReady(t *testing.T) {
	fx := newFixture(t, "")
	if code, _ := fx.do(t, "GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	if code, _ := fx.do(t, "GET", "/readyz", ""); code != 503 {
		t.Fatalf("readyz before ready: %d", code)
	}
	fx.admin.SetReady(true)
	if code, _ := fx.do(t, "GET", "/readyz", ""); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
}

func TestMetricsParse(t *testing.T) {
	fx := newFixture(t, "")
	fx.metrics.ObserveProbe("e1", true, 2*time.Millisecond)
	fx.metrics.ObserveProbe("e1", false, 500*time.Millisecond)
	if code, _ := fx.do(t, "POST", "/narwhal/engines/e4/drain", ""); code != 200 {
		t.Fatal("drain failed")
	}
	code, body := fx.do(t, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	value := func(name string, labels map[string]string) float64 {
		t.Helper()
		fam, ok := fams[name]
		if !ok {
			t.Fatalf("no metric %s", name)
		}
	next:
		for _, m := range fam.Metric {
			for _, lp := range m.Label {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return 0
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"narwhal_engines", map[string]string{"role": "prefill", "lifecycle": "active"}, 2},
		{"narwhal_engines", map[string]string{"role": "decode", "lifecycle": "active"}, 1},
		{"narwhal_engines", map[string]string{"role": "decode", "lifecycle": "draining"}, 1},
		{"narwhal_engines", map[string]string{"role": "prefill", "lifecycle": "failed"}, 0},
		{"narwhal_engine_info", map[string]string{"engine": "e4", "lifecycle": "draining"}, 1},
		{"narwhal_fleet_version", nil, 2},
		{"narwhal_fleet_changes_total", map[string]string{"kind": "lifecycle"}, 1},
		{"narwhal_health_probes_total", map[string]string{"engine": "e1", "result": "ok"}, 1},
		{"narwhal_health_probes_total", map[string]string{"engine": "e1", "result": "fail"}, 1},
		{"narwhal_health_probe_duration_seconds", map[string]string{"engine": "e1"}, 2},
		{"narwhal_build_info", map[string]string{"version": "test"}, 1},
	}
	for _, c := range checks {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
}

// Issue 11: a standby answers the calls that change the fleet or ask the controller 503
// not_leader, naming the leader, and changes nothing; it still serves the state with its ha
// section. The leader takes them.
func TestStandbyRefusesChanges(t *testing.T) {
	fx := newFixture(t, "")
	role := "standby"
	o := fx.admin.o
	o.HA = func() HAState { return HAState{Role: role, ID: "b", Leader: "a", Revision: 7} }
	a := New(o)
	srv := httptest.NewServer(a)
	defer srv.Close()
	fx.srv = srv
	code, body := fx.do(t, "POST", "/narwhal/engines/e3/drain", "")
	if code != 503 || !strings.Contains(body, `"not_leader"`) || !strings.Contains(body, `\"a\"`) {
		t.Fatalf("drain on a standby: %d %s", code, body)
	}
	if e, _ := fx.fleet.Engine("e3"); e.Lifecycle != fleet.Active {
		t.Fatalf("the standby drained e3: %+v", e)
	}
	if code, body := fx.do(t, "POST", "/narwhal/advise", ""); code != 503 || !strings.Contains(body, "not_leader") {
		t.Fatalf("advise on a standby: %d %s", code, body)
	}
	if st := fx.state(t); st.HA == nil || st.HA.Role != "standby" || st.HA.Leader != "a" || st.HA.Revision != 7 {
		t.Fatalf("state ha %+v", st.HA)
	}
	role = "leader"
	if code, body := fx.do(t, "POST", "/narwhal/engines/e3/drain", ""); code != 200 {
		t.Fatalf("drain on the leader: %d %s", code, body)
	}
}

// The admin API adds an engine (recovering until its probes pass, in the role given or the
// controller's to give), refuses bad ones with the reason, and removes only what it added.
func TestAddRemoveEngine(t *testing.T) {
	fx := newFixture(t, "tok")
	post := func(body, token string) (int, string) {
		t.Helper()
		return call(t, "POST", fx.srv.URL+"/narwhal/engines", token, body)
	}
	if code, _ := post(`{"id": "a1", "address": "10.0.0.1:8000"}`, ""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	code, body := post(`{"id": "a1", "address": "10.0.0.1:8000", "role": "prefill"}`, "tok")
	if code != 201 || !strings.Contains(body, `"lifecycle": "recovering"`) || !strings.Contains(body, `"source": "admin"`) {
		t.Fatalf("add: %d %s", code, body)
	}
	if code, body := post(`{"id": "a2", "address": "10.0.0.2:8000"}`, "tok"); code != 201 || !strings.Contains(body, `"profile": "`+config.DefaultProfileName+`"`) {
		t.Fatalf("add without role or profile: %d %s", code, body)
	}
	for body, want := range map[string]string{
		`{"id": "a3", "address": "10.0.0.1:8000"}`:                      "409 address 10.0.0.1:8000 is engine a1's",
		`{"id": "a1", "address": "10.0.0.3:8000"}`:                      "409 engine a1 is in the fleet already",
		`{"id": "a3", "address": "10.0.0.3:8000", "profile": "big"}`:    `400 unknown profile \"big\"`,
		`{"id": "a3", "address": "10.0.0.3"}`:                           "400 engine.address",
		`{"id": "a3", "address": "10.0.0.3:8000", "weight": 2}`:         `400 unknown field \"weight\"`,
		`{"id": "a3", "address": "10.0.0.3:8000", "role": "aggregate"}`: "400 engine.role",
	} {
		code, got := post(body, "tok")
		if fmt.Sprint(code) != want[:3] || !strings.Contains(got, want[4:]) {
			t.Errorf("%s: %d %s, want %s", body, code, got, want)
		}
	}
	st := fx.state(t)
	if len(st.Engines) != 6 || st.Engines[4].ID != "a1" || st.Engines[4].Source != "admin" || st.Split != (Split{2, 2}) {
		t.Fatalf("state %+v", st)
	}
	for _, s := range []struct {
		path string
		code int
	}{{"/narwhal/engines/e1", 409}, {"/narwhal/engines/zz", 404}, {"/narwhal/engines/a1", 200}, {"/narwhal/engines/a1", 404}} {
		if code, body := fx.do(t, "DELETE", s.path, "tok"); code != s.code {
			t.Errorf("DELETE %s: %d %s, want %d", s.path, code, body, s.code)
		}
	}
	if st := fx.state(t); len(st.Engines) != 5 {
		t.Fatalf("after remove: %+v", st.Engines)
	}
}
