//go:build kubernetes

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/narwhal-llm/narwhal/extproc/envoytest"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/internal/kubetest"
	"github.com/narwhal-llm/narwhal/wire"
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
`, anyPort, anyPort, anyPort, dir+"/state", ns, port, s.Kubeconfig(t, dir, "narwhal"))
	vllm := func(role string) map[string]string { return map[string]string{"app": "vllm", "llm-d.ai/role": role} }
	c.Pod(t, ns, "p", "127.0.0.2", vllm("prefill"), "")
	c.Pod(t, ns, "d", "127.0.0.3", vllm("decode"), "")
	admin, extprocAddr, _ := start(t, "serve", "--config", writeConfig(t, cfg)).serving(t)
	waitFor(t, admin, 20*time.Second, "p and d active", allActive(2))

	client := envoytest.NewTestClient(t, extprocAddr, gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: time.Minute})
	hdrs := gateway.NewRequestHeaders(http.MethodPost, "/v1/completions", "gw", http.Header{"Content-Type": {"application/json"}})
	place := func() (string, string) {
		t.Helper()
		x := client.NewExchange(context.Background())
		defer x.Close()
		res, err := x.ProcessRequest(gateway.Request{Headers: hdrs, Body: strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":4,"stream":true}`)})
		if err != nil || res.LocalReply != nil {
			t.Fatalf("request: %+v %v", res, err)
		}
		return res.Headers.Get(wire.HeaderPrefiller), res.Headers.Get(wire.HeaderDestination)
	}
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
