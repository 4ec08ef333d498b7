package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/narwhal-llm/narwhal/config"
)

// narwhal certs --admin-token writes a token admin.token_file accepts (0600, 32 random bytes in
// hex), next to the certificates, and keeps it on every later run, as it keeps the certificates;
// without the flag there is none.
func TestCertsAdminToken(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if code := run([]string{"certs", "--dir", dir, "--admin-token"}, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	path := filepath.Join(dir, "admin.token")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin.token: %v %v, want 0600", fi, err)
	}
	first, _ := os.ReadFile(path)
	tok, err := config.Admin{TokenFile: path}.ResolveToken()
	if err != nil || len(tok) != 64 || strings.Trim(tok, "0123456789abcdef") != "" {
		t.Fatalf("token %q: %v", tok, err)
	}
	for _, name := range []string{"ca.crt", "narwhal.crt", "narwhal.key", "envoy.crt", "envoy.key"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	out.Reset()
	if code := run([]string{"certs", "--dir", dir, "--admin-token"}, &out, &out); code != 0 || strings.Contains(out.String(), "wrote admin.token") {
		t.Fatalf("second run: exit %d: %s", code, out.String())
	}
	if again, _ := os.ReadFile(path); !bytes.Equal(again, first) {
		t.Fatal("a second run replaced the token")
	}
	other := t.TempDir()
	if code := run([]string{"certs", "--dir", other}, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	if _, err := os.Stat(filepath.Join(other, "admin.token")); !os.IsNotExist(err) {
		t.Fatalf("a token without --admin-token: %v", err)
	}
}
