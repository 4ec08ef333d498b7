package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/load"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// testPKI is a CA with Narwhal's server certificate, Envoy's client certificate, and the
// certificates a test turns away: another CA's, an expired one.
type testPKI struct {
	dir, ca, cert, key       string
	envoyCert, envoyKey      string
	strangerCert, strangerKy string
	expiredCert, expiredKey  string
	opCert, opKey            string // an operator's: admin.identities names it
	authority                *tlsfiles.CA
}

const envoyIdentity, operatorIdentity = "spiffe://narwhal.test/envoy", "spiffe://narwhal.test/operator"

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	p.authority, err = tlsfiles.NewCA("narwhal test CA", time.Now(), 24*time.Hour)
	must(err)
	p.ca, err = p.authority.WriteCA(p.dir, "ca")
	must(err)
	p.cert, p.key, err = p.authority.WriteLeaf(p.dir, "narwhal", tlsfiles.Leaf{Name: "narwhal", Hosts: []string{"127.0.0.1", "localhost"}, Server: true})
	must(err)
	p.envoyCert, p.envoyKey, err = p.authority.WriteLeaf(p.dir, "envoy", tlsfiles.Leaf{Name: "envoy", URIs: []string{envoyIdentity}, Client: true})
	must(err)
	p.opCert, p.opKey, err = p.authority.WriteLeaf(p.dir, "operator", tlsfiles.Leaf{Name: "operator", URIs: []string{operatorIdentity}, Client: true})
	must(err)
	p.expiredCert, p.expiredKey, err = p.authority.WriteLeaf(p.dir, "expired", tlsfiles.Leaf{Name: "envoy", URIs: []string{envoyIdentity}, Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	must(err)
	other, err := tlsfiles.NewCA("another CA", time.Now(), time.Hour)
	must(err)
	p.strangerCert, p.strangerKy, err = other.WriteLeaf(p.dir, "stranger", tlsfiles.Leaf{Name: "envoy", URIs: []string{envoyIdentity}, Client: true})
	must(err)
	return p
}

// client is a TLS client trusting the test CA, presenting cert (none when "").
func (p *testPKI) client(t testing.TB, cert, key string) *tls.Config {
	t.Helper()
	c, err := tlsfiles.Client("test", p.ca, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tlsConfig is e2eConfig with mutual TLS on every listener, and xDS open to one node id and
// one certificate identity.
func (p *testPKI) tlsConfig(engines []string) string {
	l := fmt.Sprintf("{cert_file: %q, key_file: %q, client_ca_file: %q}", p.cert, p.key, p.ca)
	return e2eConfig(anyPort, anyPort, anyPort, engines) +
		fmt.Sprintf("tls: {extproc: %s, xds: %s, admin: %s}\n", l, l, l) +
		fmt.Sprintf("xds: {nodes: [narwhal-envoy], identities: [%q]}\n", envoyIdentity) +
		fmt.Sprintf("admin: {identities: [%q]}\n", operatorIdentity)
}

// narwhal serve with mutual TLS on its three listeners: Envoy's side (narwhal load playing it,
// an ADS client) gets through with its certificate; a client with no certificate, another CA's
// or an expired one is refused at the handshake, and so is plaintext; an ADS client with a
// node id or a certificate identity not on the lists gets PERMISSION_DENIED and no resource.
// The certificate rotated under the running server: the open connection keeps going, the next
// handshake gets the new one. The bootstrap envoy-config writes for it passes validate --envoy.
func TestServeTLSEndToEnd(t *testing.T) {
	p := newTestPKI(t)
	_, engines := startEngines(t, "prefill", "decode")
	cfg := writeConfig(t, p.tlsConfig(engines))
	srv := start(t, "serve", "--config", cfg)
	admin, extproc, xdsAddr := srv.serving(t)
	if mode := logged(t, srv.out, "narwhal serving", "tls")[0]; mode != "extproc:mtls,xds:mtls,admin:mtls" {
		t.Fatalf("start line tls=%q", mode)
	}
	envoyTLS := p.client(t, p.envoyCert, p.envoyKey)
	useAdminTLS(t, admin, &http.Client{Transport: &http.Transport{TLSClientConfig: envoyTLS}})
	waitFor(t, admin, 10*time.Second, "two active engines", allActive(2))

	t.Run("admin", func(t *testing.T) {
		st, err := getStateAs[struct {
			TLS map[string]tlsfiles.Status `json:"tls"`
		}](admin)
		if err != nil || len(st.TLS) != 3 || !st.TLS["admin"].Mutual || st.TLS["xds"].Subject != "CN=narwhal" {
			t.Fatalf("state tls %+v %v", st.TLS, err)
		}
		for _, tc := range []struct {
			name string
			tls  *tls.Config
		}{
			{"no certificate", p.client(t, "", "")},
			{"another CA", p.client(t, p.strangerCert, p.strangerKy)},
			{"expired", p.client(t, p.expiredCert, p.expiredKey)},
		} {
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.tls}}
			if resp, err := c.Get("https://" + admin + "/narwhal/state"); err == nil {
				resp.Body.Close()
				t.Errorf("%s: admin answered %s", tc.name, resp.Status)
			}
		}
		if resp, err := http.Get("http://" + admin + "/narwhal/state"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Error("plaintext http to the TLS admin answered 200")
			}
		}
		// Mutating calls: Envoy's certificate reads the state but may not move engines; the
		// operator's (admin.identities) may.
		for _, tc := range []struct {
			name string
			tls  *tls.Config
			want int
		}{{"envoy", envoyTLS, http.StatusForbidden}, {"operator", p.client(t, p.opCert, p.opKey), http.StatusOK}} {
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.tls}}
			resp, err := c.Post("https://"+admin+"/narwhal/engines/e1/pin", "application/json", nil)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("%s pins e1: %d, want %d", tc.name, resp.StatusCode, tc.want)
			}
		}
	})

	t.Run("load", func(t *testing.T) {
		report := filepath.Join(t.TempDir(), "load.json")
		var stdout, stderr bytes.Buffer
		code := runBinTo(t, &stdout, &stderr, "load", "--config", cfg, "--extproc", extproc, "--admin", "https://"+admin,
			"--tls-ca", p.ca, "--tls-cert", p.envoyCert, "--tls-key", p.envoyKey,
			"--synthetic", "step", "--factor", "1", "--synthetic-rate", "10", "--synthetic-duration-s", "2", "--every-s", "1", "--report", report)
		if code != 0 {
			t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
		}
		var sum load.Summary
		if b, err := os.ReadFile(report); err != nil || json.Unmarshal(b, &sum) != nil {
			t.Fatalf("report %v: %s", err, b)
		}
		if sum.Sent < 10 || sum.OK != sum.Sent || !strings.Contains(stderr.String(), "split 1P/1D") {
			t.Fatalf("summary %+v\n%s", sum, stderr.String())
		}
		// Without the client certificate no request is placed: the gateway answers each one as
		// Envoy does when its ext_proc server cannot be reached.
		stdout.Reset()
		stderr.Reset()
		code = runBinTo(t, &stdout, &stderr, "load", "--config", cfg, "--extproc", extproc, "--admin", "", "--wait-s", "0",
			"--tls-ca", p.ca, "--synthetic", "step", "--factor", "1", "--synthetic-rate", "10", "--synthetic-duration-s", "1", "--report", report)
		sum = load.Summary{}
		if b, err := os.ReadFile(report); err != nil || json.Unmarshal(b, &sum) != nil {
			t.Fatalf("report %v: %s", err, b)
		}
		if code != 0 || sum.Sent == 0 || sum.OK != 0 {
			t.Fatalf("load without a client certificate: exit %d, summary %+v\n%s", code, sum, stderr.String())
		}
	})

	t.Run("xds", func(t *testing.T) {
		creds := func(c *tls.Config) grpc.DialOption { return grpc.WithTransportCredentials(credentials.NewTLS(c)) }
		eds := adsWatchAs(t, xdsAddr, "narwhal-envoy", creds(envoyTLS))
		awaitEDS(t, eds, "assignments over mutual TLS", func(g map[string]map[string]string) bool {
			return len(g["narwhal-engines"]) == 2
		})
		other, _, err := p.authority.WriteLeaf(p.dir, "other-envoy", tlsfiles.Leaf{Name: "other", URIs: []string{"spiffe://narwhal.test/other"}, Client: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, node string
			tls        *tls.Config
		}{
			{"unknown node", "someone-else", envoyTLS},
			{"unknown identity", "narwhal-envoy", p.client(t, other, filepath.Join(p.dir, "other-envoy.key"))},
		} {
			if code := adsRefusal(t, xdsAddr, tc.node, creds(tc.tls)); code != codes.PermissionDenied {
				t.Errorf("%s: %v, want PermissionDenied", tc.name, code)
			}
		}
		if code := adsRefusal(t, xdsAddr, "narwhal-envoy", creds(p.client(t, p.expiredCert, p.expiredKey))); code != codes.Unavailable {
			t.Errorf("expired certificate: %v, want the handshake refused (Unavailable)", code)
		}
		for _, line := range []string{`client=someone-else why="is not in xds.nodes"`, `client=spiffe://narwhal.test/other why="has no client certificate identity in xds.identities"`} {
			if n := strings.Count(srv.out.String(), line); n != 1 {
				t.Errorf("refusal logged %d times, want once: %s", n, line)
			}
		}
		if code := adsRefusal(t, xdsAddr, "someone-else", creds(envoyTLS)); code != codes.PermissionDenied {
			t.Errorf("unknown node again: %v", code)
		}
		if n := strings.Count(srv.out.String(), `client=someone-else`); n != 1 {
			t.Errorf("a second refusal of the same node logged again (%d lines)", n)
		}
	})

	t.Run("rotation", func(t *testing.T) {
		var mu sync.Mutex
		var seen []string // the common name each handshake saw
		handshakes := func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(seen)
		}
		c := p.client(t, p.envoyCert, p.envoyKey)
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			mu.Lock()
			seen = append(seen, cs.PeerCertificates[0].Subject.CommonName)
			mu.Unlock()
			return nil
		}
		mode := gateway.Mode{RequestBody: gateway.Buffered, ResponseBody: gateway.Streamed, MessageTimeout: 35 * time.Second}
		gw, err := gateway.NewGateway(extproc, mode, gateway.WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(c))))
		if err != nil {
			t.Fatal(err)
		}
		defer gw.Close()
		complete := func(what string) {
			t.Helper()
			w := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":4}`))
			gw.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				t.Fatalf("%s: status %d %s", what, w.Code, w.Body.String())
			}
		}
		complete("before the rotation")
		// An ADS stream open across the rotation keeps receiving pushes.
		eds := adsWatchAs(t, xdsAddr, "narwhal-envoy", grpc.WithTransportCredentials(credentials.NewTLS(p.client(t, p.envoyCert, p.envoyKey))))
		awaitEDS(t, eds, "assignments before the rotation", func(g map[string]map[string]string) bool { return len(g["narwhal-engines"]) == 2 })
		if _, _, err := p.authority.WriteLeaf(p.dir, "narwhal", tlsfiles.Leaf{Name: "narwhal-rotated", Hosts: []string{"127.0.0.1"}, Server: true}); err != nil {
			t.Fatal(err)
		}
		complete("on the connection opened before the rotation")
		adminClient := &http.Client{Transport: &http.Transport{TLSClientConfig: p.client(t, p.opCert, p.opKey)}}
		resp, err := adminClient.Post("https://"+admin+"/narwhal/engines/e2/drain?force=true", "application/json", nil) // its only decode engine
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("drain over https: %v %v", resp, err)
		}
		resp.Body.Close()
		awaitEDS(t, eds, "the drain pushed on the stream opened before the rotation", func(g map[string]map[string]string) bool {
			return g["narwhal-engines"]["e2"] == "DRAINING"
		})
		if s := handshakes(); len(s) != 1 || s[0] != "narwhal" {
			t.Fatalf("handshakes %v", s)
		}
		// A new connection: a new handshake, the new certificate.
		conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(credentials.NewTLS(c)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.Connect()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for len(handshakes()) < 2 && conn.WaitForStateChange(ctx, conn.GetState()) {
		}
		if s := handshakes(); len(s) != 2 || s[1] != "narwhal-rotated" {
			t.Fatalf("handshakes after the rotation %v", s)
		}
	})

	t.Run("envoy-config", func(t *testing.T) {
		// The same config on fixed ports (envoy-config writes addresses; nothing binds them).
		fixed := writeConfig(t, strings.ReplaceAll(p.tlsConfig([]string{"127.0.0.1:8001", "127.0.0.1:8002"}),
			"listen: {admin: \"127.0.0.1:0\", extproc: \"127.0.0.1:0\", xds: \"127.0.0.1:0\"}", "listen: {extproc: \"127.0.0.1:9002\", xds: \"127.0.0.1:18000\"}"))
		cfg := fixed
		out, code := runBinOut(t, "envoy-config", "--config", cfg, "--tls-ca", "/etc/envoy/tls/ca.crt",
			"--tls-cert", "/etc/envoy/tls/envoy.crt", "--tls-key", "/etc/envoy/tls/envoy.key")
		if code != 0 {
			t.Fatalf("envoy-config: exit %d %s", code, out)
		}
		loaded, err := loadConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if ps := bootstrap.Validate([]byte(out), loaded); len(ps) != 0 {
			t.Fatalf("the generated bootstrap: %v", ps)
		}
		if out, code := runBin(t, "envoy-config", "--config", cfg); code != 2 || !strings.Contains(out, "--tls-ca") {
			t.Fatalf("envoy-config without --tls-ca: exit %d %s", code, out)
		}
	})
}

// adsRefusal opens an ADS stream as node and returns the status code it ends with; it fails the
// test if a resource arrives.
func adsRefusal(t *testing.T, addr, node string, opt grpc.DialOption) codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return status.Code(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, Node: &corev3.Node{Id: node}}); err != nil && !errors.Is(err, context.Canceled) {
		return status.Code(err)
	}
	resp, err := stream.Recv()
	if err == nil {
		t.Fatalf("node %s got %d resources", node, len(resp.GetResources()))
	}
	return status.Code(err)
}
