//go:build kubernetes

// Package kubetest starts a real kube-apiserver for tests: the binary `make kube-apiserver`
// builds from the Kubernetes module into the user cache (internal/kubeapiserver), on an
// embedded etcd, on a port the system picks, with RBAC on and client-certificate users signed
// by a CA made for the test. Not a fake clientset: every watch, patch and refusal is the API
// server's own.
package kubetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/narwhal-llm/narwhal/internal/etcdtest"
	"github.com/narwhal-llm/narwhal/internal/logbuf"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// Version is the Kubernetes release the tests run against (internal/kubeapiserver/go.mod).
const Version = "v1.37.2"

// Binary is the kube-apiserver the tests run: $NARWHAL_KUBE_APISERVER, else the one `make
// kube-apiserver` put in the user cache.
func Binary() (string, error) { return cached("NARWHAL_KUBE_APISERVER", "kube-apiserver") }

// cached is a Kubernetes binary the tests run: $env, else name-Version in the user cache, where
// the Makefile builds it.
func cached(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "narwhal", name+"-"+Version), nil
}

// Server is a running kube-apiserver.
type Server struct {
	Host string // https://127.0.0.1:PORT
	// Admin is a client config of a cluster administrator (group system:masters).
	Admin *rest.Config

	t       testing.TB
	bin     string
	args    []string
	ca      *tlsfiles.CA
	caPEM   []byte
	port    int
	portFD  int // a socket bound to the port (SO_REUSEPORT, never listening): the port stays ours
	mu      sync.Mutex
	cmd     *exec.Cmd
	out     *logbuf.Buffer
	stopped chan struct{}
}

// Start starts a kube-apiserver for t; the test's end stops it.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubetest: no kube-apiserver at %s: build it once with `make kube-apiserver` (or set NARWHAL_KUBE_APISERVER): %v", bin, err)
	}
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	s := &Server{t: t, bin: bin}
	ca, err := tlsfiles.NewCA("kubetest-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s.ca, s.caPEM = ca, ca.PEM()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.crt", s.caPEM)
	servingCert, servingKey := s.issue(t, "kube-apiserver", nil, true)
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	saDER, _ := x509.MarshalECPrivateKey(saKey)
	saFile := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}))
	s.port, s.portFD = reservePort(t)
	t.Cleanup(func() { _ = syscall.Close(s.portFD) })
	s.Host = "https://127.0.0.1:" + strconv.Itoa(s.port)
	s.args = []string{
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(s.port), "--permit-port-sharing",
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none", // loopback: no kubernetes Service endpoints
		"--etcd-servers=" + etcd.Endpoints[0],
		"--client-ca-file=" + caFile,
		"--tls-cert-file=" + write("serving.crt", servingCert), "--tls-private-key-file=" + write("serving.key", servingKey),
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + saFile,
		"--service-account-signing-key-file=" + saFile,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--authorization-mode=RBAC",
		"--disable-admission-plugins=ServiceAccount", // no controller manager creates service accounts
		"--enable-priority-and-fairness=false",
		"--cert-dir=" + filepath.Join(dir, "certs"),
	}
	s.Admin = s.User(t, "admin", "system:masters")
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// User is a client config of a user (a client certificate from the test's CA) in groups.
func (s *Server) User(t testing.TB, name string, groups ...string) *rest.Config {
	t.Helper()
	cert, key := s.issue(t, name, groups, false)
	return &rest.Config{Host: s.Host, TLSClientConfig: rest.TLSClientConfig{CertData: cert, KeyData: key, CAData: s.caPEM},
		QPS: 100, Burst: 200, Timeout: 10 * time.Second}
}

// Kubeconfig writes a kubeconfig file for user (in groups) in dir and returns its path.
func (s *Server) Kubeconfig(t testing.TB, dir, user string, groups ...string) string {
	t.Helper()
	rc := s.User(t, user, groups...)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	path := filepath.Join(dir, user+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Stop stops the API server (it goes away; Restart brings it back on the same port and etcd).
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, stopped := s.cmd, s.stopped
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-stopped
	}
}

// Restart starts the API server (again) and waits until it is ready.
func (s *Server) Restart() {
	t := s.t
	t.Helper()
	s.mu.Lock()
	if s.cmd != nil {
		s.mu.Unlock()
		return
	}
	cmd := exec.Command(s.bin, s.args...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		t.Fatalf("kubetest: start %s: %v", s.bin, err)
	}
	stopped := make(chan struct{})
	go func() { _ = cmd.Wait(); close(stopped) }()
	s.cmd, s.out, s.stopped = cmd, out, stopped
	s.mu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver output (last 8 KiB):\n%s", tail(out.String(), 8<<10))
		}
	})
	cs := kubernetes.NewForConfigOrDie(s.Admin)
	deadline := time.Now().Add(90 * time.Second)
	for {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			return
		}
		select {
		case <-stopped:
			t.Fatalf("kubetest: kube-apiserver exited: %v\n%s", cmd.ProcessState, tail(out.String(), 8<<10))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubetest: kube-apiserver not ready in 90 s (last: %v %s)", err, body)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// reservePort binds a socket to a port the system picks, with SO_REUSEPORT and without
// listening: no other process takes the port while the test runs, the API server (started with
// --permit-port-sharing) binds it too, and every connection goes to the API server.
func reservePort(t testing.TB) (int, int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port, fd
}

// issue signs a certificate for name (a user in groups, or, server, the API server at 127.0.0.1).
func (s *Server) issue(t testing.TB, name string, groups []string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	l := tlsfiles.Leaf{Name: name, Groups: groups, Client: !server, Server: server, NotAfter: time.Now().Add(24 * time.Hour)}
	if server {
		l.Hosts = []string{"127.0.0.1", "localhost"}
	}
	certPEM, keyPEM, err := s.ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// String is for failure messages: the API server's output so far.
func (s *Server) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return fmt.Sprintf("kube-apiserver on %s:\n%s", s.Host, tail(s.out.String(), 8<<10))
}
