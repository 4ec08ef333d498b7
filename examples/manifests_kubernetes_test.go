//go:build kubernetes

package examples

import (
	"cmp"
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/narwhal-llm/narwhal/internal/kubetest"
)

// TestKubernetesManifestsApply: every example manifest is created on a real API server (the
// InferencePool CRD installed), with strict field validation: an unknown field, a wrong type or
// a reference the API refuses fails here.
func TestKubernetesManifestsApply(t *testing.T) {
	s := kubetest.Start(t)
	c := s.AdminClients()
	c.InstallCRD(t, "../discovery/testdata/inferencepool-crd.yaml")
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
