package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// POST /narwhal/advise evaluates a proposed split as an advisory decision: the record comes
// back and is listed at /narwhal/state, nothing moves; a bad body or split is a 400, and the
// call needs the admin token.
func TestAdvise(t *testing.T) {
	c := config.Default()
	c.Admin.Token = "s3cret"
	for i, role := range []string{"prefill", "decode", "decode"} {
		c.Engines = append(c.Engines, config.Engine{ID: "e" + string(rune('1'+i)), Address: "10.0.0." + string(rune('1'+i)) + ":80", Role: role, Profile: config.DefaultProfileName})
	}
	f, err := fleet.New(c, t0)
	if err != nil {
		t.Fatal(err)
	}
	clock := func() time.Time { return t0.Add(time.Minute) }
	rl := router.NewLive(router.New(c, f.Snapshot(), t0), clock, router.Hooks{})
	roles := controller.NewLive(controller.New(c, t0), controller.LiveOptions{Fleet: f, Router: rl})
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(New(Options{Config: c, Fleet: f, Gatherer: reg, Now: clock, Start: t0, Router: rl, Controller: roles}))
	defer srv.Close()
	post := func(body, token string) (int, string) {
		return call(t, http.MethodPost, srv.URL+"/narwhal/advise", token, body)
	}
	if code, _ := post(`{"prefill":2,"decode":1}`, ""); code != 401 {
		t.Fatalf("without the token: %d", code)
	}
	for _, bad := range []string{`{"prefill":2}`, `not json`, `{"prefill":2,"decode":1,"x":1}`, `{"prefill":3,"decode":1}`, `{"prefill":-1,"decode":4}`} {
		if code, body := post(bad, "s3cret"); code != 400 || !strings.Contains(body, "invalid_request") {
			t.Fatalf("%s: %d %s", bad, code, body)
		}
	}
	code, body := post(`{"prefill":2,"decode":1,"reason":"try"}`, "s3cret")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var d decisionlog.Decision
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Caller != "api" || d.Outcome != "advisory" || d.Reason != "try" || d.SplitAfter != (decisionlog.Split{Prefill: 2, Decode: 1}) ||
		!strings.HasPrefix(string(d.AdvisoryResult), "blocked:") && d.AdvisoryResult != decisionlog.WouldMove || len(d.Moves) != 0 || len(d.Gates) == 0 {
		t.Fatalf("%+v", d)
	}
	if e, _ := f.Engine("e2"); e.Role != fleet.Decode {
		t.Fatal("an advisory call moved an engine")
	}
	if e, _ := f.Engine("e3"); e.Role != fleet.Decode {
		t.Fatal("an advisory call moved an engine")
	}
	resp, err := http.Get(srv.URL + "/narwhal/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Decisions) != 1 || st.Decisions[0].Seq != d.Seq {
		t.Fatalf("state decisions %+v", st.Decisions)
	}
}
