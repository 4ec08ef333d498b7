package discovery

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func readyPod(name, ip string, lbl map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

// A pod is engines only while Running, Ready, not terminating and with an IP: one per port.
func TestPodEndpoints(t *testing.T) {
	p := readyPod("vllm-0", "10.1.0.7", map[string]string{"llm-d.ai/role": "decode"})
	eps := PodEndpoints(p, []int{8000})
	if len(eps) != 1 || eps[0].Name != "vllm-0" || eps[0].Address != "10.1.0.7:8000" || eps[0].Labels["llm-d.ai/role"] != "decode" {
		t.Fatalf("%+v", eps)
	}
	p.Annotations = map[string]string{"narwhal.dev/profile": "h200"}
	if eps := PodEndpoints(p, []int{8000}); eps[0].Annotations["narwhal.dev/profile"] != "h200" {
		t.Fatalf("annotations: %+v", eps)
	}
	if eps := PodEndpoints(p, []int{8000, 8001}); len(eps) != 2 || eps[1].Name != "vllm-0-8001" || eps[1].Address != "10.1.0.7:8001" {
		t.Fatalf("two ports: %+v", eps)
	}
	v6 := readyPod("v6", "fd00::7", nil)
	if eps := PodEndpoints(v6, []int{8000}); eps[0].Address != "[fd00::7]:8000" {
		t.Fatalf("IPv6: %+v", eps)
	}
	now := metav1.Now()
	for name, mutate := range map[string]func(*corev1.Pod){
		"pending":     func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending },
		"not ready":   func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse },
		"no ready":    func(p *corev1.Pod) { p.Status.Conditions = nil },
		"no ip":       func(p *corev1.Pod) { p.Status.PodIP = "" },
		"terminating": func(p *corev1.Pod) { p.DeletionTimestamp = &now },
	} {
		q := readyPod("x", "10.1.0.8", nil)
		mutate(q)
		if eps := PodEndpoints(q, []int{8000}); len(eps) != 0 {
			t.Errorf("%s pod is an engine: %+v", name, eps)
		}
	}
}

func TestPoolMembers(t *testing.T) {
	pool := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "pool"},
		"spec": map[string]any{
			"selector":    map[string]any{"matchLabels": map[string]any{"app": "vllm", "tier": "gpu"}},
			"targetPorts": []any{map[string]any{"number": int64(8000)}},
		},
	}}
	m, err := PoolMembers(pool)
	if err != nil || m.Selector.String() != "app=vllm,tier=gpu" || !slices.Equal(m.Ports, []int{8000}) {
		t.Fatalf("%v %v", m, err)
	}
	for want, spec := range map[string]map[string]any{
		"matchLabels is empty": {"selector": map[string]any{}, "targetPorts": []any{map[string]any{"number": int64(8000)}}},
		"targetPorts is empty": {"selector": map[string]any{"matchLabels": map[string]any{"a": "b"}}},
		"want a port, got 0":   {"selector": map[string]any{"matchLabels": map[string]any{"a": "b"}}, "targetPorts": []any{map[string]any{}}},
	} {
		pool.Object["spec"] = spec
		if _, err := PoolMembers(pool); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: %v, want %q", spec, err, want)
		}
	}
}
