package main

import (
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
