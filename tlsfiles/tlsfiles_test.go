package tlsfiles

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
)

// pki is a CA with a server pair and a client pair written in a directory.
type pki struct {
	dir                   string
	ca                    *CA
	caFile                string
	certFile, keyFile     string
	clientCert, clientKey string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	var err error
	if p.ca, err = NewCA("test CA", time.Now(), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if p.caFile, err = p.ca.WriteCA(p.dir, "ca"); err != nil {
		t.Fatal(err)
	}
	if p.certFile, p.keyFile, err = p.ca.WriteLeaf(p.dir, "server", Leaf{Name: "narwhal", Hosts: []string{"127.0.0.1", "localhost"}, Server: true}); err != nil {
		t.Fatal(err)
	}
	if p.clientCert, p.clientKey, err = p.ca.WriteLeaf(p.dir, "envoy", Leaf{Name: "envoy", Client: true}); err != nil {
		t.Fatal(err)
	}
	return p
}

// echo serves TLS with cfg on a system-picked port: each line read is written back.
func echo(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials addr with cfg, completes the handshake and echoes one line.
func roundTrip(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := ping(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// ping echoes a line; with TLS 1.3 a refused client certificate shows here, not in Dial.
func ping(c *tls.Conn) error {
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return os.ErrInvalid
	}
	return nil
}

func client(t *testing.T, p *pki, cert, key string) *tls.Config {
	t.Helper()
	c, err := Client("test", p.caFile, cert, key)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "127.0.0.1"
	return c
}

// Mutual TLS: only a client with a current certificate from the client CA gets through; every
// refusal is counted with its reason.
func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	s, err := NewServer("tls.extproc", Files{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.caFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := echo(t, s.Config())

	c, err := roundTrip(addr, client(t, p, p.clientCert, p.clientKey))
	if err != nil {
		t.Fatalf("a client with a certificate from the client CA: %v", err)
	}
	c.Close()

	other, err := NewCA("other CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wrongCert, wrongKey, err := other.WriteLeaf(p.dir, "stranger", Leaf{Name: "stranger", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	expCert, expKey, err := p.ca.WriteLeaf(p.dir, "expired", Leaf{Name: "expired", Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	serverOnly, serverOnlyKey := p.certFile, p.keyFile // no client-auth usage
	for _, tc := range []struct {
		name, cert, key, reason string
	}{
		{"no certificate", "", "", "sent no certificate"},
		{"another CA", wrongCert, wrongKey, "unknown authority"},
		{"expired", expCert, expKey, "expired"},
		{"not for clients", serverOnly, serverOnlyKey, "incompatible key usage"},
	} {
		before := s.Status().Refused
		if c, err := roundTrip(addr, client(t, p, tc.cert, tc.key)); err == nil {
			c.Close()
			t.Errorf("%s: the handshake went through", tc.name)
			continue
		}
		st := s.Status()
		if st.Refused != before+1 || !strings.Contains(st.LastRefusal, tc.reason) {
			t.Errorf("%s: refused %d (before %d), last refusal %q, want it to say %q", tc.name, st.Refused, before, st.LastRefusal, tc.reason)
		}
	}

	// A server without a client CA asks for no certificate.
	plain, err := NewServer("tls.admin", Files{CertFile: p.certFile, KeyFile: p.keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := roundTrip(echo(t, plain.Config()), client(t, p, "", "")); err != nil {
		t.Fatalf("TLS without a client CA: %v", err)
	} else {
		c.Close()
	}
	// A client that does not trust the server's CA is refused by its own check.
	if c, err := roundTrip(addr, &tls.Config{ServerName: "127.0.0.1"}); err == nil {
		c.Close()
		t.Fatal("a client trusting the system roots accepted the test CA")
	}
	if st := plain.Status(); st.Mutual || st.Subject != "CN=narwhal" || st.NotAfter.Before(time.Now()) {
		t.Fatalf("status %+v", st)
	}
}

// Rotation: the files replaced under a running server; the connection already open keeps going
// on the old certificate, the next handshake gets the new one. A change that does not load
// keeps the last good certificate and says why, until the files change again.
func TestRotation(t *testing.T) {
	p := newPKI(t)
	s, err := NewServer("tls.xds", Files{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.caFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := echo(t, s.Config())
	old, err := roundTrip(addr, client(t, p, p.clientCert, p.clientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldSerial := old.ConnectionState().PeerCertificates[0].SerialNumber

	if _, _, err := p.ca.WriteLeaf(p.dir, "server", Leaf{Name: "narwhal-2", Hosts: []string{"127.0.0.1"}, Server: true}); err != nil {
		t.Fatal(err)
	}
	fresh, err := roundTrip(addr, client(t, p, p.clientCert, p.clientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	got := fresh.ConnectionState().PeerCertificates[0]
	if got.SerialNumber.Cmp(oldSerial) == 0 || got.Subject.CommonName != "narwhal-2" {
		t.Fatalf("the handshake after the rotation served %s %v, the old one was %v", got.Subject.CommonName, got.SerialNumber, oldSerial)
	}
	if err := ping(old); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}

	// A key that does not match: the last good certificate stays.
	other, _, err := p.ca.Issue(Leaf{Name: "x", Server: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.certFile, other, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := roundTrip(addr, client(t, p, p.clientCert, p.clientKey))
	if err != nil {
		t.Fatalf("after a bad change: %v", err)
	}
	if cn := c.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "narwhal-2" {
		t.Fatalf("after a bad change the server presented %q", cn)
	}
	c.Close()
	if st := s.Status(); !strings.Contains(st.ReloadError, "tls.xds: cert_file") || st.Subject != "CN=narwhal-2" {
		t.Fatalf("status after a bad change: %+v", st)
	}
	// Fixed: loads, and the error is gone.
	if _, _, err := p.ca.WriteLeaf(p.dir, "server", Leaf{Name: "narwhal-3", Hosts: []string{"127.0.0.1"}, Server: true}); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(); st.ReloadError != "" || st.Subject != "CN=narwhal-3" {
		t.Fatalf("status after the fix: %+v", st)
	}

	// A rotated client CA: a client of the old CA is refused from the next handshake on.
	ca2, err := NewCA("CA 2", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca2.WriteCA(p.dir, "ca"); err != nil {
		t.Fatal(err)
	}
	// The client still trusts the old CA for the server, which ca.crt no longer holds: use a pool
	// of the old CA built before the rotation.
	cc := client(t, p, p.clientCert, p.clientKey)
	cc.RootCAs.AddCert(p.ca.Cert)
	if c, err := roundTrip(addr, cc); err == nil {
		c.Close()
		t.Fatal("a client of the old CA got through after the client CA rotated")
	}
	if st := s.Status(); !strings.Contains(st.LastRefusal, "unknown authority") {
		t.Fatalf("after the client CA rotated: last refusal %q", st.LastRefusal)
	}
}

// Bad files are errors naming the key and the file, before anything serves.
func TestBadFiles(t *testing.T) {
	p := newPKI(t)
	missing := filepath.Join(p.dir, "missing.crt")
	for _, tc := range []struct {
		files Files
		want  string
	}{
		{Files{CertFile: missing, KeyFile: p.keyFile}, "tls.admin: cert_file " + missing},
		{Files{CertFile: p.certFile, KeyFile: p.clientKey}, "private key does not match"},
		{Files{CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.keyFile}, "tls.admin.client_ca_file: " + p.keyFile + ": no PEM certificate"},
	} {
		if _, err := NewServer("tls.admin", tc.files, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.files, err, tc.want)
		}
	}
	if _, err := Client("--tls-ca", missing, "", ""); err == nil || !strings.Contains(err.Error(), "--tls-ca: CA file") {
		t.Errorf("client with a missing CA: %v", err)
	}
	if _, err := Client("--tls-cert", p.caFile, p.clientCert, ""); err == nil || !strings.Contains(err.Error(), "needs both") {
		t.Errorf("client certificate without its key: %v", err)
	}
}

func TestIdentities(t *testing.T) {
	ca, err := NewCA("CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := ca.Issue(Leaf{Name: "envoy-1", Hosts: []string{"envoy.llm", "10.0.0.1"}, URIs: []string{"spiffe://cluster.local/ns/llm/sa/envoy"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(c)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Identities(cert), ",")
	if got != "spiffe://cluster.local/ns/llm/sa/envoy,envoy.llm" {
		t.Fatalf("identities %s (the common name counts only without SANs)", got)
	}
	bare, _, err := ca.Issue(Leaf{Name: "envoy-2", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	block, _ = pem.Decode(bare)
	cert, _ = x509.ParseCertificate(block.Bytes)
	if got := Identities(cert); len(got) != 1 || got[0] != "envoy-2" || !Allowed([]*x509.Certificate{cert}, map[string]bool{"envoy-2": true}) || Allowed(nil, map[string]bool{"envoy-2": true}) {
		t.Fatalf("a certificate without SANs: %v", got)
	}
	if _, _, err := ca.Issue(Leaf{Name: "nothing"}); err == nil {
		t.Fatal("a certificate for neither servers nor clients was issued")
	}
}

// Every listener offers AEAD suites only: a TLS 1.2 client that offers nothing but CBC with a
// SHA-1 MAC is refused at the handshake; one offering GCM gets through, and TLS 1.3 (all AEAD)
// is unchanged.
func TestAEADSuitesOnly(t *testing.T) {
	p := newPKI(t)
	s, err := NewServer("tls.admin", Files{CertFile: p.certFile, KeyFile: p.keyFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := echo(t, s.Config())
	dial := func(suites []uint16, maxVersion uint16) error {
		c := client(t, p, "", "")
		c.CipherSuites, c.MaxVersion = suites, maxVersion
		conn, err := roundTrip(addr, c)
		if err == nil {
			conn.Close()
		}
		return err
	}
	cbc := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA}
	if err := dial(cbc, tls.VersionTLS12); err == nil {
		t.Error("a TLS 1.2 client offering only CBC-SHA1 suites got through")
	}
	if err := dial(AEADSuites(), tls.VersionTLS12); err != nil {
		t.Errorf("a TLS 1.2 client offering AEAD suites: %v", err)
	}
	if err := dial(nil, tls.VersionTLS13); err != nil {
		t.Errorf("TLS 1.3: %v", err)
	}
}

// Listeners serves TLS on the listeners whose config names a certificate, and says so: the start
// line's summary, /narwhal/state's status (nil with every listener plaintext), gRPC credentials
// for a TLS listener and none for a plaintext one.
func TestListeners(t *testing.T) {
	plain, err := NewListeners(config.TLS{}, slog.New(slog.DiscardHandler))
	if err != nil || plain.Summary() != "extproc:plaintext,xds:plaintext,admin:plaintext" || plain.StatusFunc() != nil || GRPCCreds(plain.ExtProc) != nil {
		t.Fatalf("plaintext: %+v %v", plain, err)
	}
	dir := t.TempDir()
	ca, err := NewCA("test", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.Issue(Leaf{Name: "narwhal", Hosts: []string{"localhost"}, Server: true, NotBefore: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key"), filepath.Join(dir, "ca.crt")
	for f, b := range map[string][]byte{certFile: cert, keyFile: key, caFile: ca.PEM()} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	l, err := NewListeners(config.TLS{
		ExtProc: config.ListenerTLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile},
		Admin:   config.ListenerTLS{CertFile: certFile, KeyFile: keyFile},
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Summary(); got != "extproc:mtls,xds:plaintext,admin:tls" {
		t.Errorf("summary %q", got)
	}
	if st := l.StatusFunc()(); len(st) != 2 || !st["extproc"].Mutual || st["admin"].Mutual {
		t.Errorf("status %+v", st)
	}
	if len(GRPCCreds(l.ExtProc)) != 1 || GRPCCreds(l.XDS) != nil {
		t.Error("gRPC credentials: one for a TLS listener, none for a plaintext one")
	}
	if _, err := NewListeners(config.TLS{XDS: config.ListenerTLS{CertFile: filepath.Join(dir, "none.crt"), KeyFile: keyFile}}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "tls.xds") {
		t.Errorf("a certificate that does not load: %v", err)
	}
}
