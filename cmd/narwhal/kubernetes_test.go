package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A Kubernetes client config error names the config section that asked for it (House III:
// ha.kubernetes's errors named discovery.kubernetes).
func TestKubeClientConfigNamesItsSection(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a cluster
	for _, key := range []string{"discovery.kubernetes", "ha.kubernetes"} {
		if _, err := kubeClientConfig(key, filepath.Join(t.TempDir(), "missing")); err == nil || !strings.HasPrefix(err.Error(), key+".kubeconfig ") {
			t.Errorf("%s, a missing file: %v", key, err)
		}
		if _, err := kubeClientConfig(key, ""); err == nil || !strings.Contains(err.Error(), "set "+key+".kubeconfig") {
			t.Errorf("%s, in-cluster outside a cluster: %v", key, err)
		}
	}
}

// narwhal links none of client-go's typed clients, informers or scheme: they bring every API
// group's client into the build; the dynamic client and tools/cache do the same work
// (docs/kubernetes.md, "Which pods are engines").
func TestNoTypedKubernetesClients(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, typed := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/listers"} {
			if pkg == typed || strings.HasPrefix(pkg, typed+"/") {
				t.Errorf("narwhal links %s: use the dynamic client (docs/kubernetes.md)", pkg)
			}
		}
	}
}
