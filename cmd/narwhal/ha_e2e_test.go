package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/etcdtest"
)

func rolesOf(st stateView) map[string]string {
	out := map[string]string{}
	for _, e := range st.Engines {
		out[e.ID] = e.Role
	}
	return out
}

func sameRoles(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func readyz(admin string) int {
	resp, err := http.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Issue 11, HA on a real etcd (embedded, started by the test): two replicas of narwhal serve,
// one leads and the other stands by (readyz 503); the leader killed (SIGKILL), the standby leads
// within the lease with the same roles; a restarted replica stands by; the leader stopped
// (SIGTERM) resigns after its drain and the standby leads at once.
func TestServeHATakeover(t *testing.T) {
	etcd := etcdtest.Start(t)
	_, engines := startEngines(t, "prefill", "prefill", "decode", "decode")
	const ttl = 2
	cfg := writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines)+
		fmt.Sprintf("ha: {etcd: {endpoints: [%q], prefix: /narwhal-e2e}, lease_ttl_s: %d}\n", etcd.Endpoints[0], ttl))

	type rep struct {
		p     *proc
		admin string
	}
	startRep := func() rep {
		p := start(t, "serve", "--config", cfg)
		a, _, _ := p.serving(t)
		return rep{p, a}
	}
	role := func(r rep) string { st, _ := getState(r.admin); return st.HA.Role }
	a := startRep()
	waitFor(t, a.admin, 10*time.Second, "a leads", func(s stateView) bool { return s.HA.Role == "leader" })
	b := startRep()
	st := waitFor(t, b.admin, 10*time.Second, "b stands by, a leading", func(s stateView) bool {
		return s.HA.Role == "standby" && s.HA.Leader != "" && s.HA.Leader != s.HA.ID
	})
	if code := readyz(b.admin); code != 503 {
		t.Fatalf("the standby's /readyz: %d, want 503", code)
	}
	if code := readyz(a.admin); code != 200 {
		t.Fatalf("the leader's /readyz: %d, want 200", code)
	}
	before := rolesOf(waitFor(t, a.admin, 10*time.Second, "four active engines", allActive(4)))
	if !sameRoles(rolesOf(st), before) {
		t.Fatalf("the standby serves other roles: %v, the leader %v", rolesOf(st), before)
	}

	// The leader dies without a word.
	_ = a.p.cmd.Process.Kill()
	_ = a.p.cmd.Wait()
	killed := time.Now()
	st = waitFor(t, b.admin, 5*ttl*time.Second, "b leads after the kill", func(s stateView) bool { return s.HA.Role == "leader" })
	took := time.Since(killed)
	t.Logf("takeover after a kill: %v (lease %d s)", took, ttl)
	if took > time.Duration(ttl+2)*time.Second {
		t.Fatalf("takeover took %v, want within the lease (%d s) and a margin", took, ttl)
	}
	if after := rolesOf(st); !sameRoles(after, before) {
		t.Fatalf("roles flipped at takeover: %v, before %v", after, before)
	}
	if code := readyz(b.admin); code != 200 {
		t.Fatalf("the new leader's /readyz: %d", code)
	}

	// The killed replica comes back: it stands by.
	c := startRep()
	waitFor(t, c.admin, 10*time.Second, "c stands by", func(s stateView) bool { return s.HA.Role == "standby" })

	// The leader is stopped: it drains, resigns, and c leads at once.
	stopped := time.Now()
	if code, _ := b.p.stop(t); code != 0 {
		t.Fatalf("the leader exited %d on SIGTERM", code)
	}
	waitFor(t, c.admin, 5*time.Second, "c leads after the SIGTERM", func(s stateView) bool { return s.HA.Role == "leader" })
	t.Logf("takeover after SIGTERM: %v (from the signal, the drain included)", time.Since(stopped))
	if r := role(c); r != "leader" {
		t.Fatalf("c is %s", r)
	}
}
