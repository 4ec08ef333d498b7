package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// newCerts writes a first set of certificates for Narwhal's TLS (docs/security.md): a CA, a
// server certificate for Narwhal's listeners and a client certificate for Envoy (mutual TLS).
// It is for a first deployment and the examples; production certificates come from the
// operator's PKI. Files already there are kept, so that it can run on every start.
func newCerts(stdout io.Writer) *cobra.Command {
	var (
		dir, envoyURI string
		hosts         []string
		days          int
		adminToken    bool
	)
	cmd := &cobra.Command{
		Use:   "certs --dir DIR [--hosts NAMES]",
		Short: "Write a CA, Narwhal's server certificate and Envoy's client certificate (PEM) for tls.*",
		Long: "Writes into --dir: ca.crt (a new CA; its key is not kept), narwhal.crt and narwhal.key (the\n" +
			"server certificate of tls.extproc, tls.xds and tls.admin, for --hosts), envoy.crt and envoy.key\n" +
			"(Envoy's client certificate for mutual TLS: narwhal envoy-config --tls-cert, --tls-key). Keys are\n" +
			"0600. When ca.crt is already there nothing is written (run it on every start). With --admin-token\n" +
			"it also writes admin.token (0600, 32 random bytes in hex, for admin.token_file) when it is not there.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if dir == "" {
				return usageErr(errors.New("certs: --dir is required"))
			}
			if len(hosts) == 0 {
				return usageErr(errors.New("certs: --hosts needs at least one name"))
			}
			if days < 1 {
				return usageErr(fmt.Errorf("certs: --days must be >= 1, got %d", days))
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return failureErr(fmt.Errorf("certs: %w", err))
			}
			if adminToken {
				switch wrote, err := writeAdminToken(filepath.Join(dir, "admin.token")); {
				case err != nil:
					return failureErr(fmt.Errorf("certs: %w", err))
				case wrote:
					fmt.Fprintf(stdout, "certs: wrote admin.token into %s (admin.token_file)\n", dir)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "ca.crt")); err == nil {
				fmt.Fprintf(stdout, "certs: %s already holds ca.crt: kept (remove the files to make new ones)\n", dir)
				return nil
			}
			now := time.Now()
			validity := time.Duration(days) * 24 * time.Hour
			ca, err := tlsfiles.NewCA("narwhal CA", now, validity)
			if err != nil {
				return failureErr(err)
			}
			var uris []string
			if envoyURI != "" {
				uris = []string{envoyURI}
			}
			if _, _, err := ca.WriteLeaf(dir, "narwhal", tlsfiles.Leaf{Name: "narwhal", Hosts: hosts, Server: true, NotAfter: now.Add(validity)}); err != nil {
				return failureErr(fmt.Errorf("certs: %w", err))
			}
			if _, _, err := ca.WriteLeaf(dir, "envoy", tlsfiles.Leaf{Name: "envoy", URIs: uris, Client: true, NotAfter: now.Add(validity)}); err != nil {
				return failureErr(fmt.Errorf("certs: %w", err))
			}
			// The CA last: its presence means the set is complete.
			if _, err := ca.WriteCA(dir, "ca"); err != nil {
				return failureErr(fmt.Errorf("certs: %w", err))
			}
			fmt.Fprintf(stdout, "certs: wrote ca.crt, narwhal.crt/.key (%v) and envoy.crt/.key into %s, valid %d days\n", hosts, dir, days)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "directory to write the files into (created if missing)")
	f.StringSliceVar(&hosts, "hosts", []string{"narwhal", "localhost", "127.0.0.1"}, "names and IPs Narwhal's certificate is for: the hosts Envoy and other clients dial")
	f.StringVar(&envoyURI, "envoy-uri", "", "a URI SAN for Envoy's certificate (a SPIFFE ID, say) to list in xds.identities; the common name is \"envoy\" either way")
	f.IntVar(&days, "days", 365, "validity of the certificates, days")
	f.BoolVar(&adminToken, "admin-token", false, "also write admin.token, a new admin API token (admin.token_file), unless there is one")
	return cmd
}

// writeAdminToken writes a new admin token (32 random bytes, hex) to path, 0600, unless a file
// is there already (kept: it may be in use); it reports whether it wrote one.
func writeAdminToken(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	_, err = f.WriteString(hex.EncodeToString(b[:]) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err == nil, err
}
