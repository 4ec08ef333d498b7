//go:build kubernetes

package discovery

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/internal/kubetest"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

const ns = "llm"

// narwhalRules are the Role docs/kubernetes.md asks for, pod verbs aside.
func narwhalRules(podVerbs ...string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: podVerbs},
		{APIGroups: []string{"inference.networking.k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"apps"}, Resources: []string{"replicasets", "statefulsets", "daemonsets"}, Verbs: []string{"get"}},
	}
}

// cluster is a real API server with the namespace, the InferencePool CRD, and a user "narwhal"
// bound to the Role docs/kubernetes.md asks for.
type cluster struct {
	kubetest.Clients
	s *kubetest.Server
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	s := kubetest.Start(t)
	c := &cluster{Clients: s.AdminClients(), s: s}
	c.Namespace(t, ns)
	c.Grant(t, ns, "narwhal", narwhalRules("get", "list", "watch", "patch")...)
	c.InstallCRD(t, "testdata/inferencepool-crd.yaml")
	return c
}

func (c *cluster) pod(t *testing.T, name, ip string, lbl map[string]string, node string) {
	t.Helper()
	c.Pod(t, ns, name, ip, lbl, node)
}

func (c *cluster) get(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	return c.GetPod(t, ns, name)
}

// apiWait bounds what the API server and the watcher take to agree.
const apiWait = 30 * time.Second

func watcher(t *testing.T, c *cluster, user string, kc config.DiscoveryKubernetes) (*Kubernetes, *fleet.Fleet) {
	t.Helper()
	cfg := config.Default()
	cfg.Engines = nil
	cfg.Discovery.Kubernetes = kc
	f, err := fleet.New(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rc := c.s.User(t, user)
	server, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(rc))
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubernetes{Config: kc, Client: dynamic.NewForConfigOrDie(rc), Server: server,
		Source: NewSource(SourceKubernetes, cfg), Fleet: f, RoleLabel: config.LabelRole, Now: time.Now, Log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return k, f
}

// Membership follows the pods: Ready pods join in their label's role (or open), a pod that is
// no longer Ready, terminating or deleted leaves, a pod back at another IP leaves and joins; a
// move by the controller is written to the pod's label, an operator's relabel is taken; the
// API server going away loses nothing, and what changed while it was away is caught up.
func TestKubernetesDiscovery(t *testing.T) {
	c := newCluster(t)
	k, f := watcher(t, c, "narwhal", config.DiscoveryKubernetes{Namespace: ns, Selector: "app=vllm", Ports: []int{8000}, WriteRoleLabel: true, ResyncS: 300})
	vllm := func(role string) map[string]string {
		l := map[string]string{"app": "vllm"}
		if role != "" {
			l[config.LabelRole] = role
		}
		return l
	}
	c.pod(t, "p1", "10.1.0.1", vllm("prefill"), "")
	c.pod(t, "d1", "10.1.0.2", vllm("decode"), "")
	c.pod(t, "x1", "10.1.0.3", vllm("prefill-decode"), "node-a")
	c.pod(t, "other", "10.1.0.9", map[string]string{"app": "web"}, "")
	is := func(want ...string) func() bool {
		slices.Sort(want)
		return func() bool { got := members(f); slices.Sort(got); return slices.Equal(got, want) }
	}
	poll.Until(t, apiWait, "three engines", is("p1@10.1.0.1:8000:prefill", "d1@10.1.0.2:8000:decode", "x1@10.1.0.3:8000:decode"))
	if x, _ := f.Engine("x1"); !x.RoleOpen || x.Source != SourceKubernetes {
		t.Fatalf("x1 = %+v", x)
	}

	// d1 not Ready: it leaves. x1 deleted while on a node: terminating, it leaves.
	c.SetReady(t, c.get(t, "d1"), "10.1.0.2", false)
	c.DeletePod(t, ns, "x1")
	poll.Until(t, apiWait, "d1 and x1 gone", is("p1@10.1.0.1:8000:prefill"))
	if c.get(t, "x1").DeletionTimestamp == nil {
		t.Fatal("x1 is not terminating: the test does not test that")
	}
	// d1 Ready again at a new IP (a rescheduled pod of the same name): it joins there.
	c.DeletePod(t, ns, "d1")
	c.pod(t, "d1", "10.1.0.12", vllm("decode"), "")
	poll.Until(t, apiWait, "d1 at its new address", is("p1@10.1.0.1:8000:prefill", "d1@10.1.0.12:8000:decode"))

	// The controller moves p1 to decode: the pod's label follows.
	if _, err := f.SetRole("p1", fleet.Decode, time.Now(), "decision 3"); err != nil {
		t.Fatal(err)
	}
	// The pod shows the label as soon as the API server has it, a moment before the writer
	// counts its write: wait for both.
	poll.Until(t, apiWait, "p1's label written and counted", func() bool {
		return c.get(t, "p1").Labels[config.LabelRole] == "decode" && k.Status().LabelWrites >= 1
	})
	if s := k.Status(); s.LabelWrites != 1 || s.LabelErrors != 0 {
		t.Fatalf("status %+v", s)
	}
	// An operator relabels d1 prefill: the fleet takes it as the operator's move.
	var evs []fleet.Event
	evCh := make(chan fleet.Event, 16)
	f.OnChange(func(e fleet.Event) { evCh <- e })
	patch := []byte(`{"metadata":{"labels":{"llm-d.ai/role":"prefill"}}}`)
	if _, err := c.Kube.CoreV1().Pods(ns).Patch(context.Background(), "d1", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, apiWait, "d1 relabelled", is("p1@10.1.0.1:8000:decode", "d1@10.1.0.12:8000:prefill"))
	for len(evCh) > 0 {
		evs = append(evs, <-evCh)
	}
	if len(evs) != 1 || evs[0].Kind != fleet.EventRole || !evs[0].Operator {
		t.Fatalf("events %+v", evs)
	}
	if s := k.Status(); s.LabelWrites != 1 {
		t.Fatalf("the operator's relabel was written back: %+v", s)
	}

	// The API server goes away: placement keeps the membership, the status says so.
	c.s.Stop()
	poll.Until(t, apiWait, "unreachable reported", func() bool { return k.Status().Unreachable != "" })
	if got := members(f); len(got) != 2 {
		t.Fatalf("membership lost while the API server is away: %v", got)
	}
	c.s.Restart()
	c.pod(t, "d2", "10.1.0.4", vllm("decode"), "")
	poll.Until(t, apiWait, "d2 joins after the API server is back", is("p1@10.1.0.1:8000:decode", "d1@10.1.0.12:8000:prefill", "d2@10.1.0.4:8000:decode"))
	poll.Until(t, apiWait, "reachable again", func() bool { return k.Status().Unreachable == "" })
}

// An InferencePool names the members: its selector and target ports; a change of the pool is
// followed; a missing pool keeps what the fleet has and says so.
func TestKubernetesInferencePool(t *testing.T) {
	c := newCluster(t)
	pools := c.Dynamic.Resource(InferencePoolResource).Namespace(ns)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama", "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"model": "llama"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}},
			"endpointPickerRef": map[string]any{"name": "narwhal", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	if _, err := pools.Create(context.Background(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k, f := watcher(t, c, "narwhal", config.DiscoveryKubernetes{Namespace: ns, InferencePool: "llama", ResyncS: 300})
	c.pod(t, "a", "10.2.0.1", map[string]string{"model": "llama", config.LabelRole: "prefill"}, "")
	c.pod(t, "b", "10.2.0.2", map[string]string{"model": "mistral", config.LabelRole: "decode"}, "")
	poll.Until(t, apiWait, "a from the pool", func() bool { return slices.Equal(members(f), []string{"a@10.2.0.1:8000:prefill"}) })
	// The pool now takes mistral pods on port 9000.
	cur, err := pools.Get(context.Background(), "llama", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedStringMap(cur.Object, map[string]string{"model": "mistral"}, "spec", "selector", "matchLabels")
	_ = unstructured.SetNestedSlice(cur.Object, []any{map[string]any{"number": int64(9000)}}, "spec", "targetPorts")
	if _, err := pools.Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, apiWait, "b from the changed pool", func() bool { return slices.Equal(members(f), []string{"b@10.2.0.2:9000:decode"}) })
	if s := k.Status(); s.Selector != "model=mistral" || !slices.Equal(s.Ports, []int{9000}) {
		t.Fatalf("status %+v", s)
	}
	if err := pools.Delete(context.Background(), "llama", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, apiWait, "the missing pool reported", func() bool { return strings.Contains(k.Status().Error, "not found") })
	if got := members(f); len(got) != 1 {
		t.Fatalf("a missing pool emptied the fleet: %v", got)
	}
}

// RBAC that forbids the watch or the patch is said in one line naming the verb and resource.
func TestKubernetesRBAC(t *testing.T) {
	c := newCluster(t)
	c.Grant(t, ns, "readonly", narwhalRules("get", "list", "watch")...)
	k, f := watcher(t, c, "readonly", config.DiscoveryKubernetes{Namespace: ns, Selector: "app=vllm", Ports: []int{8000}, WriteRoleLabel: true, ResyncS: 300})
	c.pod(t, "p1", "10.3.0.1", map[string]string{"app": "vllm", config.LabelRole: "prefill"}, "")
	poll.Until(t, apiWait, "p1 joins", func() bool { return len(members(f)) == 1 })
	if _, err := f.SetRole("p1", fleet.Decode, time.Now(), "decision 1"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, apiWait, "the refused patch reported", func() bool { return strings.Contains(k.Status().LabelError, "forbidden to patch pods") })

	nobody, _ := watcher(t, c, "nobody", config.DiscoveryKubernetes{Namespace: ns, Selector: "app=vllm", Ports: []int{8000}, ResyncS: 300})
	poll.Until(t, apiWait, "the refused watch reported", func() bool {
		return strings.Contains(nobody.Status().WatchError, "forbidden to list and watch pods")
	})
}

// The role label is written only where it is safe (issue 34): not to a pod whose ReplicaSet
// selects on it (llm-d's modelservice chart does: the new value would take the pod out of the
// ReplicaSet, which would start a replacement GPU pod), not over prefill-decode or both (the
// operator said the pod can play either), never to a pod recreated under the same name; and a
// pod in a role Narwhal does not place (llm-d's encode roles) is no engine.
func TestKubernetesRoleLabelWrites(t *testing.T) {
	c := newCluster(t)
	k, f := watcher(t, c, "narwhal", config.DiscoveryKubernetes{Namespace: ns, Selector: "app=vllm", Ports: []int{8000}, WriteRoleLabel: true, ResyncS: 300})
	role := func(r string) map[string]string { return map[string]string{"app": "vllm", config.LabelRole: r} }
	byRole := c.ReplicaSet(t, ns, "llama-prefill", role("prefill"))                              // modelservice's selector
	plain := c.ReplicaSet(t, ns, "llama-plain", map[string]string{"app": "vllm", "tier": "gpu"}) // leaves the role label alone
	c.OwnedPod(t, ns, "p1", "10.2.0.1", role("prefill"), "", byRole)
	p2 := map[string]string{"app": "vllm", "tier": "gpu", config.LabelRole: "prefill"}
	c.OwnedPod(t, ns, "p2", "10.2.0.2", p2, "", plain)
	c.pod(t, "x1", "10.2.0.3", role("prefill-decode"), "")
	c.pod(t, "b1", "10.2.0.4", role("both"), "")
	c.pod(t, "e1", "10.2.0.5", role("encode"), "")
	poll.Until(t, apiWait, "four engines, e1 not one", func() bool {
		got := members(f)
		slices.Sort(got)
		return slices.Equal(got, []string{"b1@10.2.0.4:8000:decode", "p1@10.2.0.1:8000:prefill", "p2@10.2.0.2:8000:prefill", "x1@10.2.0.3:8000:decode"}) &&
			slices.ContainsFunc(k.Status().Problems, func(p string) bool {
				return strings.Contains(p, `e1: label llm-d.ai/role="encode": not a role Narwhal places`)
			})
	})
	for _, id := range []string{"p1", "p2", "x1", "b1"} {
		to := fleet.Decode
		if id == "x1" || id == "b1" {
			to = fleet.Prefill
		}
		if _, err := f.SetRole(id, to, time.Now(), "decision 1"); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, apiWait, "p2 written, p1 refused", func() bool {
		s := k.Status()
		return c.get(t, "p2").Labels[config.LabelRole] == "decode" && s.LabelWrites == 1 && s.LabelRefused == 1
	})
	s := k.Status()
	if !strings.Contains(s.LabelRefusal, "ReplicaSet llama-prefill selects its pods on llm-d.ai/role") || !strings.Contains(s.LabelRefusal, "write_role_label: false") {
		t.Errorf("refusal %q", s.LabelRefusal)
	}
	for name, want := range map[string]string{"p1": "prefill", "x1": "prefill-decode", "b1": "both"} {
		if got := c.get(t, name).Labels[config.LabelRole]; got != want {
			t.Errorf("%s labelled %s, want %s left", name, got, want)
		}
	}
	if s.LabelErrors != 0 {
		t.Errorf("label errors: %+v", s)
	}
	// A write for a pod since recreated under the same name (another UID) is refused by the API
	// server: the new pod keeps its own label.
	k.mu.Lock()
	stale := k.pods["p2"]
	k.mu.Unlock()
	c.DeletePod(t, ns, "p2")
	c.OwnedPod(t, ns, "p2", "10.2.0.2", p2, "", plain)
	if err := k.patchRole(context.Background(), stale, "decode"); err == nil {
		t.Fatal("a stale pod's role was written to its successor")
	}
	if got := c.get(t, "p2").Labels[config.LabelRole]; got != "prefill" {
		t.Fatalf("the recreated p2 is labelled %s", got)
	}
}
