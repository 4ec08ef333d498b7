//go:build kubernetes

package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/internal/kubetest"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// The endpoint-picker examples' Deployment rolled by Kubernetes' own Deployment and ReplicaSet
// controllers (issue 34): two replicas of narwhal serve electing on a Lease, only the leader
// Ready, the test playing the kubelet (a process per pod, the pod Ready while its /readyz says
// so). With the examples' strategy the rollout completes and a new replica leads; with the
// default RollingUpdate (what the example had) it cannot: no new pod becomes Ready while the old
// leader holds the Lease, and the old leader is not taken down while no new pod is Ready.
func TestKubernetesRollout(t *testing.T) {
	strategy := examplesStrategy(t)
	t.Run("the examples' strategy", func(t *testing.T) { roll(t, strategy, true) })
	t.Run("the default RollingUpdate", func(t *testing.T) { roll(t, appsv1.DeploymentStrategy{}, false) })
}

// examplesStrategy is the strategy of the endpoint-picker examples' Deployments, which agree.
func examplesStrategy(t *testing.T) appsv1.DeploymentStrategy {
	t.Helper()
	var got []appsv1.DeploymentStrategy
	for _, f := range []string{"../../examples/kubernetes/narwhal-epp.yaml", "../../examples/kubernetes/llm-d/narwhal.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var d appsv1.Deployment
			if err := yaml.Unmarshal([]byte(doc), &d); err == nil && d.Kind == "Deployment" {
				got = append(got, d.Spec.Strategy)
			}
		}
	}
	if len(got) != 2 || got[0] != got[1] {
		t.Fatalf("the examples' Deployment strategies: %+v", got)
	}
	return got[0]
}

// kubelet plays the kubelet for the Deployment's pods: a narwhal serve per pod, the pod Ready
// while the replica's /readyz answers 200, the process stopped when its pod goes.
type kubelet struct {
	t    *testing.T
	c    kubetest.Clients
	ns   string
	cfg  string
	pods map[types.UID]*podProc
	ips  int
}

type podProc struct {
	p     *proc
	admin string
	name  string
	rev   string // the pod template's revision (annotation rev)
	ready bool
}

// sync brings the processes and the pods' status in line once.
func (k *kubelet) sync() {
	t := k.t
	list, err := k.c.Kube.CoreV1().Pods(k.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=narwhal"})
	if err != nil {
		return // the API server between two answers
	}
	seen := map[types.UID]bool{}
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.DeletionTimestamp != nil {
			continue
		}
		seen[pod.UID] = true
		pp, ok := k.pods[pod.UID]
		if !ok {
			p := start(t, "serve", "--config", k.cfg)
			admin, _, _ := p.serving(t)
			pp = &podProc{p: p, admin: admin, name: pod.Name, rev: pod.Annotations["rev"], ready: true} // set not Ready below
			k.pods[pod.UID] = pp
			k.ips++
			pod.Status.PodIP = fmt.Sprintf("10.1.0.%d", k.ips)
		}
		if ready := readyz(pp.admin) == 200; ready != pp.ready {
			pp.ready = ready
			ip := pod.Status.PodIP
			if ip == "" {
				ip = fmt.Sprintf("10.1.0.%d", k.ips)
			}
			cur, err := k.c.Kube.CoreV1().Pods(k.ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
			if err == nil {
				k.c.SetReady(t, cur, ip, ready)
			}
		}
	}
	for uid, pp := range k.pods {
		if !seen[uid] { // the pod is gone: the kubelet stops its container
			_ = pp.p.cmd.Process.Signal(syscall.SIGTERM)
			delete(k.pods, uid)
		}
	}
}

// leaderPod is the pod whose replica is Ready (nil when none).
func (k *kubelet) leaderPod() *podProc {
	for _, pp := range k.pods {
		if pp.ready {
			return pp
		}
	}
	return nil
}

// revs are the template revisions of the pods running.
func (k *kubelet) revs() map[string]int {
	out := map[string]int{}
	for _, pp := range k.pods {
		out[pp.rev]++
	}
	return out
}

func roll(t *testing.T, strategy appsv1.DeploymentStrategy, completes bool) {
	s, cfg := leaseFleet(t, "", "prefill", "decode")
	s.StartControllers(t)
	c := s.AdminClients()
	const ns = "narwhal"
	two := int32(2)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "narwhal", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two, Strategy: strategy,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "narwhal"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "narwhal"}, Annotations: map[string]string{"rev": "1"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "narwhal", Image: "ghcr.io/narwhal-llm/narwhal:v0.1.0"}}},
			},
		},
	}
	ctx := context.Background()
	if _, err := c.Kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k := &kubelet{t: t, c: c, ns: ns, cfg: cfg, pods: map[types.UID]*podProc{}}
	var first *podProc
	poll.Until(t, 60*time.Second, "two replicas, one leading", func() bool {
		k.sync()
		first = k.leaderPod()
		return len(k.pods) == 2 && first != nil
	})
	// Roll: a change of the pod template, as a new image would be.
	patch := []byte(`{"spec":{"template":{"metadata":{"annotations":{"rev":"2"}}}}}`)
	if _, err := c.Kube.AppsV1().Deployments(ns).Patch(ctx, "narwhal", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rolled := time.Now()
	done := func() bool {
		dep, err := c.Kube.AppsV1().Deployments(ns).Get(ctx, "narwhal", metav1.GetOptions{})
		if err != nil {
			return false
		}
		st, l := dep.Status, k.leaderPod()
		// Every pod of the new template, one of them leading, as the controller sees it too.
		return st.ObservedGeneration >= dep.Generation && st.UpdatedReplicas == 2 && st.Replicas == 2 && st.AvailableReplicas >= 1 &&
			l != nil && l.rev == "2" && k.revs()["2"] == 2 && len(k.revs()) == 1
	}
	if !completes {
		if poll.Within(15*time.Second, func() bool { k.sync(); return done() }) {
			t.Fatal("the default RollingUpdate completed: the examples need no strategy of their own")
		}
		if l := k.leaderPod(); l != first {
			t.Fatalf("the old leader %s was replaced (leader now %+v): the rollout was not stuck", first.name, l)
		}
		t.Logf("after 15 s the rollout has not completed: pods by template revision %v; %s (revision 1) still leads", k.revs(), first.name)
		return
	}
	poll.Until(t, 90*time.Second, "the rollout complete, a new replica leading", func() bool { k.sync(); return done() })
	t.Logf("rolled in %v: %s led before, %s (revision 2) leads now", time.Since(rolled).Round(100*time.Millisecond), first.name, k.leaderPod().name)
}
