package preflight

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// The tls rows: a listener whose certificate loads and has weeks left passes; one that expires
// within MinCertLife, one expired and one whose files do not load fail, each saying why; a
// plaintext listener has no row.
func TestTLSChecks(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().Truncate(time.Second) // certificates carry whole seconds
	ca, err := tlsfiles.NewCA("CA", now, 24*time.Hour*365)
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(name string, notAfter time.Time) config.ListenerTLS {
		c, k, err := ca.WriteLeaf(dir, name, tlsfiles.Leaf{Name: name, Server: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: notAfter})
		if err != nil {
			t.Fatal(err)
		}
		return config.ListenerTLS{CertFile: c, KeyFile: k}
	}
	good := leaf("good", now.Add(90*24*time.Hour))
	good.ClientCAFile = caFile
	var cfg config.Config
	cfg.TLS = config.TLS{ExtProc: good, XDS: leaf("soon", now.Add(3*24*time.Hour)), Admin: leaf("old", now.Add(-time.Hour))}
	var got []Check
	tlsChecks(&cfg, now, func(c Check) { got = append(got, c) })
	want := []struct {
		listener string
		ok       bool
		detail   string
	}{
		{"extproc", true, "(CN=good) valid 90 more days, clients need a certificate from " + caFile},
		{"xds", false, "(CN=soon) expires in 72h0m0s: renew it"},
		{"admin", false, "(CN=old) expired 1h0m0s ago"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows: %+v", len(got), got)
	}
	for i, w := range want {
		if got[i].Check != "tls" || got[i].Engine != w.listener || got[i].OK != w.ok || !strings.Contains(got[i].Detail, w.detail) {
			t.Errorf("row %d: %+v, want %+v", i, got[i], w)
		}
	}

	cfg.TLS = config.TLS{Admin: config.ListenerTLS{CertFile: filepath.Join(dir, "missing.crt"), KeyFile: good.KeyFile}}
	got = nil
	tlsChecks(&cfg, now, func(c Check) { got = append(got, c) })
	if len(got) != 1 || got[0].OK || !strings.Contains(got[0].Detail, "tls.admin: cert_file") {
		t.Fatalf("missing file: %+v", got)
	}
}
