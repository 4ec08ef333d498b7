//go:build kubernetes

package kubetest

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/internal/poll"
)

// Clients are an administrator's clients of a Server.
type Clients struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
}

// AdminClients returns the administrator's clients.
func (s *Server) AdminClients() Clients {
	return Clients{Kube: kubernetes.NewForConfigOrDie(s.Admin), Dynamic: dynamic.NewForConfigOrDie(s.Admin)}
}

// Namespace creates a namespace.
func (c Clients) Namespace(t testing.TB, name string) {
	t.Helper()
	if _, err := c.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Grant binds user, in namespace ns, to a Role of the rules.
func (c Clients) Grant(t testing.TB, ns, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	r := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns}, Rules: rules}
	if _, err := c.Kube.RbacV1().Roles(ns).Create(ctx, r, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	if _, err := c.Kube.RbacV1().RoleBindings(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// InstallCRD creates the CustomResourceDefinition in the YAML file at path and waits until it
// is established.
func (c Clients) InstallCRD(t testing.TB, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	crds := c.Dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	u := &unstructured.Unstructured{Object: obj}
	if _, err := crds.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "CRD "+u.GetName()+" established", func() bool {
		got, err := crds.Get(context.Background(), u.GetName(), metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		return slices.ContainsFunc(conds, func(c any) bool {
			m, _ := c.(map[string]any)
			return m["type"] == "Established" && m["status"] == "True"
		})
	})
}

// Pod creates a pod and makes it Running and Ready at ip, as a kubelet would. On a node, its
// deletion is graceful: it stays, terminating, until a kubelet that never comes finishes it.
func (c Clients) Pod(t testing.TB, ns, name, ip string, labels map[string]string, node string) {
	t.Helper()
	c.OwnedPod(t, ns, name, ip, labels, node, nil)
}

// OwnedPod is Pod with a controlling owner (a ReplicaSet's pod, say), or none.
func (c Clients) OwnedPod(t testing.TB, ns, name, ip string, labels map[string]string, node string, owner *metav1.OwnerReference) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "engine", Image: "vllm/vllm-openai"}}}}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	p, err := c.Kube.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReady(t, p, ip, true)
	return p
}

// ReplicaSet creates a ReplicaSet of no replicas selecting its pods on selector (no controller
// runs here: it is a workload to own pods and be read), and returns a controlling owner
// reference to it.
func (c Clients) ReplicaSet(t testing.TB, ns, name string, selector map[string]string) *metav1.OwnerReference {
	t.Helper()
	zero := int32(0)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{Replicas: &zero, Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: selector},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm/vllm-openai"}}}}}}
	rs, err := c.Kube.AppsV1().ReplicaSets(ns).Create(context.Background(), rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))
}

// SetReady sets a pod's status as a kubelet would: Running at ip, Ready or not.
func (c Clients) SetReady(t testing.TB, p *corev1.Pod, ip string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}
	if _, err := c.Kube.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// GetPod reads a pod.
func (c Clients) GetPod(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// DeletePod deletes a pod.
func (c Clients) DeletePod(t testing.TB, ns, name string) {
	t.Helper()
	if err := c.Kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
