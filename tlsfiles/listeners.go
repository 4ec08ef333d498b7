package tlsfiles

import (
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/narwhal-llm/narwhal/config"
)

// Listeners is the TLS of each of serve's listeners that serves it (docs/security.md): nil for
// a plaintext one.
type Listeners struct {
	ExtProc, XDS, Admin *Server
}

// NewListeners reads the certificate files of every listener with tls.*.cert_file: a file that
// does not load is an error, before anything listens.
func NewListeners(c config.TLS, log *slog.Logger) (*Listeners, error) {
	t := &Listeners{}
	for _, l := range []struct {
		key  string
		conf config.ListenerTLS
		srv  **Server
	}{{"tls.extproc", c.ExtProc, &t.ExtProc}, {"tls.xds", c.XDS, &t.XDS}, {"tls.admin", c.Admin, &t.Admin}} {
		if !l.conf.Enabled() {
			continue
		}
		s, err := NewServer(l.key, Files{CertFile: l.conf.CertFile, KeyFile: l.conf.KeyFile, ClientCAFile: l.conf.ClientCAFile}, log)
		if err != nil {
			return nil, err
		}
		*l.srv = s
	}
	return t, nil
}

// named are the three listeners by name, nil for plaintext.
func (t *Listeners) named() []struct {
	name string
	s    *Server
} {
	return []struct {
		name string
		s    *Server
	}{{"extproc", t.ExtProc}, {"xds", t.XDS}, {"admin", t.Admin}}
}

// GRPCCreds are the gRPC server options of a listener: its TLS credentials, none for plaintext.
func GRPCCreds(s *Server) []grpc.ServerOption {
	if s == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(s.Config()))}
}

// Register registers every TLS listener's metrics.
func (t *Listeners) Register(reg prometheus.Registerer) {
	for _, l := range t.named() {
		if l.s != nil {
			l.s.Register(reg)
		}
	}
}

// StatusFunc is /narwhal/state's tls: nil when every listener is plaintext.
func (t *Listeners) StatusFunc() func() map[string]Status {
	if *t == (Listeners{}) {
		return nil
	}
	return func() map[string]Status {
		m := map[string]Status{}
		for _, l := range t.named() {
			if l.s != nil {
				m[l.name] = l.s.Status()
			}
		}
		return m
	}
}

// Summary is serve's start line's tls: each listener plaintext, tls or mtls
// (extproc:tls,xds:tls,admin:plaintext).
func (t *Listeners) Summary() string {
	var parts []string
	for _, l := range t.named() {
		mode := "plaintext"
		if l.s != nil {
			mode = "tls"
			if l.s.Status().Mutual {
				mode = "mtls"
			}
		}
		parts = append(parts, l.name+":"+mode)
	}
	return strings.Join(parts, ",")
}
