//go:build kubernetes

package ha

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/internal/kubetest"
)

// TestKubernetesLease: replicas elect one leader on a real API server's Lease; the state is
// written only by the leader of the latest epoch, read and followed by the others; a leader
// that stops renewing is replaced within the Lease's duration, one that resigns at once.
func TestKubernetesLease(t *testing.T) {
	s := kubetest.Start(t)
	c := s.AdminClients()
	const ns = "narwhal"
	c.Namespace(t, ns)
	// The examples' Role, read from the manifest (only this Lease and this state ConfigMap, by
	// name, and create for the first replica; no list): the election, the state's writes, reads
	// and watch all run under it.
	c.Grant(t, ns, "narwhal", exampleRole(t).Rules...)
	node := func(id string) *LeaseNode {
		rc := s.User(t, "narwhal")
		return NewLeaseNode(LeaseOptions{Leases: dynamic.NewForConfigOrDie(rc), State: dynamic.NewForConfigOrDie(rc), Namespace: ns, Name: "narwhal", LeaseTTLS: 2, ID: id})
	}
	ctx := context.Background()
	a, b := node("a"), node("b")
	if err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	won := make(chan error, 1)
	go func() { won <- b.Campaign(ctx) }()
	if id, err := b.Leader(ctx); id != "a" || err != nil {
		t.Fatalf("leader %q %v", id, err)
	}
	if _, err := b.Save(ctx, []byte("b's")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a standby wrote: %v", err)
	}
	rev1, err := a.Save(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	follow, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	seen := b.Watch(follow, rev1)
	if data, rev, err := b.Load(ctx); string(data) != "one" || rev != rev1 || err != nil {
		t.Fatalf("load %q %d %v", data, rev, err)
	}
	if _, err := a.Save(ctx, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if got := <-seen; string(got) != "two" {
		t.Fatalf("the standby saw %q", got)
	}

	// a stops renewing (a process paused or killed): b takes over within the Lease's duration,
	// and a's writes are refused from then on.
	a.mu.Lock()
	a.stop()
	a.mu.Unlock()
	select {
	case err := <-won:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not take over within 10 s of a 2 s Lease")
	}
	if _, err := a.Save(ctx, []byte("late")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the deposed leader wrote: %v", err)
	}
	if _, err := b.Save(ctx, []byte("three")); err != nil {
		t.Fatal(err)
	}
	// A state written by a later epoch fences this one off.
	cm, err := c.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "narwhal-state", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Annotations[epochAnnotation] != "2" || cm.Data[stateDataKey] != "three" {
		t.Fatalf("state %v %v", cm.Annotations, cm.Data)
	}
	cm.Annotations[epochAnnotation] = "99"
	if _, err := c.Kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Save(ctx, []byte("four")); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("written over a later epoch: %v", err)
	}
	// b resigns: a new replica leads at its first try.
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	d := node("d")
	begin := time.Now()
	if err := d.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took > time.Second {
		t.Fatalf("took %v after a resignation", took)
	}
	if id, _ := d.Leader(ctx); id != "d" {
		t.Fatalf("leader %q", id)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// exampleRole is the Role of examples/kubernetes/narwhal-envoy.yaml (Lease and state named
// narwhal and narwhal-state, as these tests use).
func exampleRole(t *testing.T) rbacv1.Role {
	t.Helper()
	data, err := os.ReadFile("../examples/kubernetes/narwhal-envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var r rbacv1.Role
		if err := yaml.UnmarshalStrict([]byte(doc), &r); err == nil && r.Kind == "Role" {
			if len(r.Rules) == 0 {
				t.Fatal("the example Role has no rules")
			}
			return r
		}
	}
	t.Fatal("no Role in examples/kubernetes/narwhal-envoy.yaml")
	return rbacv1.Role{}
}
