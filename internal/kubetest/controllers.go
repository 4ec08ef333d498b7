//go:build kubernetes

package kubetest

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/logbuf"
)

// ControllerManagerBinary is the kube-controller-manager the tests that roll a Deployment run:
// $NARWHAL_KUBE_CONTROLLER_MANAGER, else the user cache's (`make kube-controller-manager`
// builds it from internal/kubeapiserver).
func ControllerManagerBinary() (string, error) {
	return cached("NARWHAL_KUBE_CONTROLLER_MANAGER", "kube-controller-manager")
}

// StartControllers runs Kubernetes' Deployment and ReplicaSet controllers against s (as its
// administrator) until the test ends: Deployments roll, ReplicaSets create and delete pods. No
// scheduler or kubelet runs: the test plays the kubelet (a pod's status is the test's to set).
func (s *Server) StartControllers(t testing.TB) {
	t.Helper()
	bin, err := ControllerManagerBinary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubetest: no kube-controller-manager at %s: build it once with `make kube-controller-manager` (or set NARWHAL_KUBE_CONTROLLER_MANAGER): %v", bin, err)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin,
		"--kubeconfig="+s.Kubeconfig(t, dir, "kube-controller-manager", "system:masters"),
		"--controllers=deployment,replicaset",
		"--leader-elect=false",
		"--secure-port=0", // serves nothing
		"--concurrent-deployment-syncs=2", "--concurrent-replicaset-syncs=2",
	)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("kubetest: start %s: %v", bin, err)
	}
	stopped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(stopped) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-stopped
		}
		if t.Failed() {
			t.Logf("kube-controller-manager output (last 8 KiB):\n%s", tail(out.String(), 8<<10))
		}
	})
}
