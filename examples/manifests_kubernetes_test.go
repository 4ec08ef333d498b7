//go:build kubernetes

package examples

import (
	"cmp"
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/internal/kubetest"
)

// TestKubernetesManifestsApply: every example manifest is created on a real API server (the
// InferencePool CRD installed), with strict field validation: an unknown field, a wrong type or
// a reference the API refuses fails here.
func TestKubernetesManifestsApply(t *testing.T) {
	s := kubetest.Start(t)
	c := s.AdminClients()
	c.InstallCRD(t, "../discovery/testdata/inferencepool-crd.yaml")
	c.InstallCRD(t, "testdata/destinationrule-crd.yaml")
	all := manifests(t)
	// Namespaces first: those the manifests declare are created from them, the others here.
	slices.SortStableFunc(all, func(a, b manifest) int {
		return cmp.Compare(b2i(a.obj.GetKind() != "Namespace"), b2i(b.obj.GetKind() != "Namespace"))
	})
	namespaces := map[string]bool{}
	for _, m := range all {
		if m.obj.GetKind() == "Namespace" {
			namespaces[m.obj.GetName()] = true
		}
	}
	for _, m := range all {
		if ns := m.obj.GetNamespace(); ns != "" && !namespaces[ns] {
			c.Namespace(t, ns)
			namespaces[ns] = true
		}
		gvk := m.obj.GroupVersionKind()
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		_, err := c.Dynamic.Resource(gvr).Namespace(m.obj.GetNamespace()).Create(context.Background(), m.obj, metav1.CreateOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Errorf("%s: %s %s: %v", m.file, gvk.Kind, m.obj.GetName(), err)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The llm-d example's InferencePool patch applies to a pool as llm-d's P/D guide creates it
// (gaie-pd, its picker gaie-pd-epp), and leaves it naming Narwhal's Service.
func TestKubernetesLLMDPoolPatch(t *testing.T) {
	s := kubetest.Start(t)
	c := s.AdminClients()
	c.InstallCRD(t, "../discovery/testdata/inferencepool-crd.yaml")
	c.Namespace(t, "llm-d-pd")
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "gaie-pd", "namespace": "llm-d-pd"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"llm-d.ai/inferenceServing": "true"}},
			"targetPorts":       []any{map[string]any{"number": int64(8000)}},
			"endpointPickerRef": map[string]any{"name": "gaie-pd-epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	res := c.Dynamic.Resource(discovery.InferencePoolResource).Namespace("llm-d-pd")
	if _, err := res.Create(context.Background(), pool, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatal(err)
	}
	patch, err := yaml.YAMLToJSON(mustRead(t, "kubernetes/llm-d/inferencepool-patch.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := res.Patch(context.Background(), "gaie-pd", types.MergePatchType, patch, metav1.PatchOptions{FieldValidation: "Strict"})
	if err != nil {
		t.Fatal(err)
	}
	if name, _, _ := unstructured.NestedString(got.Object, "spec", "endpointPickerRef", "name"); name != "narwhal-epp" {
		t.Fatalf("the pool's picker is %q", name)
	}
	if _, err := discovery.PoolMembers(got); err != nil {
		t.Fatalf("the patched pool: %v", err)
	}
}
