//go:build kubernetes

package main

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/narwhal-llm/narwhal/internal/kubetest"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// TestKubernetesServeEndToEnd: narwhal serve with no engines in its config, taking them from
// pods on a real API server (kubeconfig, RBAC as docs/kubernetes.md says), real enginesim
// processes behind the pods' IPs. Requests are placed through the ext_proc server while pods
// come, become unready and go.
func TestKubernetesServeEndToEnd(t *testing.T) {
	s := kubetest.Start(t)
	c := s.AdminClients()
	const ns = "llm"
	c.Namespace(t, ns)
	c.Grant(t, ns, "narwhal", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}})
	// Engines on loopback addresses of their own, on one port: what pods on one port look like.
	first := startEngineAt(t, "127.0.0.2:0", "prefill")
	_, port, _ := net.SplitHostPort(logged(t, first.out, "enginesim serving", "addr")[0])
	startEngineAt(t, "127.0.0.3:"+port, "decode")
	startEngineAt(t, "127.0.0.4:"+port, "prefill")
	dir := t.TempDir()
	cfg := fmt.Sprintf(`listen: {admin: %q, extproc: %q, xds: %q}
health: {interval_s: 0.1, timeout_s: 0.1, unhealthy_after: 3, healthy_after: 3, recover_s: 0.3}
shutdown_grace_s: 1
state: {dir: %q}
discovery:
  kubernetes: {namespace: %s, selector: app=vllm, ports: [%s], kubeconfig: %q, write_role_label: true}
router: {local_prefill: off}
`, anyPort, anyPort, anyPort, dir+"/state", ns, port, s.Kubeconfig(t, dir, "narwhal"))
	vllm := func(role string) map[string]string { return map[string]string{"app": "vllm", "llm-d.ai/role": role} }
	c.Pod(t, ns, "p", "127.0.0.2", vllm("prefill"), "")
	c.Pod(t, ns, "d", "127.0.0.3", vllm("decode"), "")
	admin, extprocAddr, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, admin, 20*time.Second, "p and d active", allActive(2))

	place := placer(t, extprocAddr)
	if p, d := place(); p != "127.0.0.2:"+port || d != "127.0.0.3:"+port {
		t.Fatalf("placed on %s/%s", p, d)
	}
	// p becomes unready (its engine still answers: the pod's readiness decides), p2 comes.
	c.SetReady(t, c.GetPod(t, ns, "p"), "127.0.0.2", false)
	c.Pod(t, ns, "p2", "127.0.0.4", vllm("prefill"), "")
	waitFor(t, admin, 20*time.Second, "p gone, p2 active", func(s stateView) bool {
		return len(s.Engines) == 2 && lifecycleOf(s, "p") == "" && lifecycleOf(s, "p2") == "active"
	})
	if p, _ := place(); p != "127.0.0.4:"+port {
		t.Fatalf("placed on prefill %s, want p2", p)
	}
	st, err := getStateAs[map[string]any](admin)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := st["discovery"].(map[string]any)["kubernetes"].(map[string]any)
	if k["synced"] != true || k["engines"] != 2.0 || k["namespace"] != ns {
		t.Fatalf("discovery state %v", st["discovery"])
	}
}

// TestKubernetesServeHATakeover: two replicas of narwhal serve elect their leader on a real API
// server's Lease and keep the state in its ConfigMap (ha.kubernetes). The leader killed, the
// standby leads within the Lease with the same roles; the leader stopped (SIGTERM), it resigns
// and the standby leads at once; the replicas' decision logs, merged, audit clean.
func TestKubernetesServeHATakeover(t *testing.T) {
	_, cfg := leaseFleet(t, "controller: {reactive: {step_s: 0.2, urgent_delay_s: 0.05}}\n", "prefill", "prefill", "decode", "decode")
	logs := t.TempDir()
	aLog, bLog, cLog := logs+"/a.jsonl", logs+"/b.jsonl", logs+"/c.jsonl"
	a := startReplica(t, cfg, "leader", "--decisions", aLog)
	b := startReplica(t, cfg, "standby", "--decisions", bLog)
	before := rolesOf(waitFor(t, a.admin, 10*time.Second, "four active engines", allActive(4)))
	waitFor(t, b.admin, 10*time.Second, "b follows a's roles", func(st stateView) bool {
		return st.HA.Leader != "" && st.HA.Leader != st.HA.ID && sameRoles(rolesOf(st), before)
	})
	if code := readyz(b.admin); code != 503 {
		t.Fatalf("the standby's /readyz: %d", code)
	}
	waitFor(t, a.admin, 10*time.Second, "the leader has decided", func(s stateView) bool { return len(s.Decisions) > 1 })
	_ = a.p.cmd.Process.Kill()
	_ = a.p.cmd.Wait()
	killed := time.Now()
	st := waitFor(t, b.admin, 5*ttl*time.Second, "b leads after the kill", func(s stateView) bool { return s.HA.Role == "leader" })
	took := time.Since(killed)
	t.Logf("takeover after a kill: %v (Lease %d s)", took, ttl)
	if took > time.Duration(ttl+2)*time.Second {
		t.Fatalf("takeover took %v, want within the Lease (%d s) and a margin", took, ttl)
	}
	if after := rolesOf(st); !sameRoles(after, before) {
		t.Fatalf("roles flipped at takeover: %v, before %v", after, before)
	}
	cRep := startReplica(t, cfg, "standby", "--decisions", cLog)
	stopped := time.Now()
	if code, _ := b.p.stop(t); code != 0 {
		t.Fatalf("the leader exited %d on SIGTERM", code)
	}
	waitFor(t, cRep.admin, 5*time.Second, "c leads after the SIGTERM", func(s stateView) bool { return s.HA.Role == "leader" })
	t.Logf("takeover after SIGTERM: %v (from the signal, the drain included)", time.Since(stopped))
	if out, code := runBin(t, "audit", "--decisions", aLog+","+bLog, "--decisions", cLog); code != 0 || !strings.Contains(out, " 0 violations") {
		t.Fatalf("audit of the merged logs: exit %d\n%s", code, out)
	}
}

// The API server away while a replica leads on its Lease: the leader keeps routing with the
// roles it has (SERVING, /readyz 200, leader in /narwhal/state), its state writes fail — so it
// makes no role move — and /narwhal/state says why; it does not exit while the API server is
// gone. When it answers again, the replica, whose Lease has run out, exits to restart as a
// standby (the supervisor's job), as a deposed etcd leader does.
func TestKubernetesServeHAAPIServerDown(t *testing.T) {
	s, cfg := leaseFleet(t, "", "prefill", "decode")
	ar := startReplica(t, cfg, "leader")
	waitFor(t, ar.admin, 10*time.Second, "both engines active", allActive(2))
	s.Stop()
	if code, err := httpPost("http://" + ar.admin + "/narwhal/engines/e2/drain?force=true"); err != nil || code != 200 { // the only decode engine: past its floor
		t.Fatalf("drain: %d %v", code, err)
	}
	var st struct {
		HA struct {
			Role       string `json:"role"`
			StateError string `json:"state_error"`
		} `json:"ha"`
	}
	poll.Within(3*ttl*time.Second, func() bool {
		st, _ = getStateAs[struct {
			HA struct {
				Role       string `json:"role"`
				StateError string `json:"state_error"`
			} `json:"ha"`
		}](ar.admin)
		return st.HA.Role == "leader" && strings.Contains(st.HA.StateError, "unreachable")
	})
	if st.HA.Role != "leader" || !strings.Contains(st.HA.StateError, "unreachable") {
		t.Fatalf("a leader with the API server away: %+v\n%s", st.HA, ar.p.out.String())
	}
	if ar.p.cmd.ProcessState != nil || readyz(ar.admin) != 200 {
		t.Fatalf("the leader stopped serving with the API server away:\n%s", ar.p.out.String())
	}
	s.Restart()
	done := make(chan struct{})
	go func() { _ = ar.p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the replica whose Lease ran out did not step down once the API server answered:\n%s", ar.p.out.String())
	}
	// Whichever it notices first — its Lease gone, or a state write fenced off — it says why.
	if !strings.Contains(ar.p.out.String(), "exiting so that this replica restarts as a standby") {
		t.Fatalf("no reason given:\n%s", ar.p.out.String())
	}
}

// ttl is the Lease of the HA tests on Kubernetes: a Lease is renewed by a request to the API
// server, and 2 s leaves no margin on a loaded machine.
const ttl = 4

// leaseFleet starts an API server with the Role ha.kubernetes needs, and engines of roles, and
// writes the replicas' config (extra appended).
func leaseFleet(t *testing.T, extra string, roles ...string) (*kubetest.Server, string) {
	t.Helper()
	s := kubetest.Start(t)
	c := s.AdminClients()
	const ns = "narwhal"
	c.Namespace(t, ns)
	c.Grant(t, ns, "narwhal",
		rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update"}})
	_, engines := startEngines(t, roles...)
	return s, writeConfig(t, e2eConfig(anyPort, anyPort, anyPort, engines)+
		fmt.Sprintf("ha: {kubernetes: {namespace: %s, kubeconfig: %q}, lease_ttl_s: %d}\n", ns, s.Kubeconfig(t, t.TempDir(), "narwhal"), ttl)+extra)
}
