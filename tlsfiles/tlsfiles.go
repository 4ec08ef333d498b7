// Package tlsfiles serves and dials TLS with certificates read from files: a server's pair is
// re-read when its files change (rotation without a restart: the next handshake uses the new
// certificate, connections already open keep theirs), and, with a client CA, a client without a
// certificate that CA signed is refused at the handshake (mutual TLS). TLS 1.2 and later with
// Go's default cipher suites. docs/security.md is the operator's reference.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Files name a server's certificate chain, its key and, for mutual TLS, the CA (one or more PEM
// certificates) its clients' certificates must chain to.
type Files struct {
	CertFile, KeyFile, ClientCAFile string
}

// Server is one listener's TLS: the certificate pair and client CA of Files, reloaded when the
// files change. Every handshake (and every Status) first compares the files' size, modification
// time and inode with those last read — a few stat calls — and re-reads them when they differ.
// A change that does not load (a key that does not match the certificate, a half-written file)
// keeps the last good certificate, is logged once and counted, and is tried again when the files
// change again.
type Server struct {
	name  string // the config key, such as tls.extproc
	files Files
	log   *slog.Logger

	mu       sync.Mutex
	seen     [3]FileStamp // of cert, key, client CA when last read (good or not)
	cert     *tls.Certificate
	leaf     *x509.Certificate
	pool     *x509.CertPool // nil without a client CA
	loadedAt time.Time
	loadErr  string // why the last change did not load; "" once one did
	refused  uint64
	lastRef  string

	reloads  *prometheus.CounterVec // result: ok, error
	refusals prometheus.Counter
}

// FileStamp identifies a file's content without reading it: its size, modification time and
// inode (or why stat failed). A file rewritten in place, renamed over, or a Kubernetes Secret's
// directory swapped, changes it.
type FileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
	err   string
}

// Stamp stats path.
func Stamp(path string) FileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return FileStamp{err: err.Error()}
	}
	return FileStamp{size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi)}
}

// NewServer reads files for the listener named by key (tls.extproc, say). A file that cannot be
// read, a key that does not match its certificate or a client CA file with no certificate is an
// error naming the key and the file.
func NewServer(key string, files Files, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{name: key, files: files, log: log,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name:        "narwhal_tls_reloads_total",
			Help:        "Certificate files of a listener read again after they changed, by result (ok, error: the last good certificate stays).",
			ConstLabels: prometheus.Labels{"listener": listenerLabel(key)},
		}, []string{"result"}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "narwhal_tls_client_refusals_total",
			Help:        "Handshakes refused because the client had no certificate from the listener's client CA (mutual TLS).",
			ConstLabels: prometheus.Labels{"listener": listenerLabel(key)},
		}),
	}
	st := s.stamps()
	if err := s.load(st); err != nil {
		return nil, err
	}
	return s, nil
}

func listenerLabel(key string) string {
	if len(key) > 4 && key[:4] == "tls." {
		return key[4:]
	}
	return key
}

// Register adds the server's metrics (reloads, refusals, the certificate's expiry) to reg.
func (s *Server) Register(reg prometheus.Registerer) {
	reg.MustRegister(s.reloads, s.refusals, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "narwhal_tls_certificate_not_after_seconds",
		Help:        "When the certificate a listener serves expires (Unix time).",
		ConstLabels: prometheus.Labels{"listener": listenerLabel(s.name)},
	}, func() float64 { return float64(s.Status().NotAfter.Unix()) }))
}

func (s *Server) stamps() [3]FileStamp {
	var st [3]FileStamp
	for i, p := range []string{s.files.CertFile, s.files.KeyFile, s.files.ClientCAFile} {
		if p != "" {
			st[i] = Stamp(p)
		}
	}
	return st
}

// load reads the files; on success they replace what is served. st is recorded as seen either
// way, so that a bad change is reported once.
func (s *Server) load(st [3]FileStamp) error {
	s.seen = st
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return fmt.Errorf("%s: cert_file %s, key_file %s: %w", s.name, s.files.CertFile, s.files.KeyFile, err)
	}
	var pool *x509.CertPool
	if s.files.ClientCAFile != "" {
		if pool, err = ReadPool(s.files.ClientCAFile); err != nil {
			return fmt.Errorf("%s.client_ca_file: %w", s.name, err)
		}
	}
	s.cert, s.leaf, s.pool = &cert, cert.Leaf, pool
	s.loadedAt, s.loadErr = time.Now(), ""
	return nil
}

// ReadPool reads a PEM file of CA certificates.
func ReadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

// current returns what to serve, reloading first when the files changed.
func (s *Server) current() (*tls.Certificate, *x509.CertPool) {
	st := s.stamps()
	s.mu.Lock()
	defer s.mu.Unlock()
	if st != s.seen {
		if err := s.load(st); err != nil {
			s.loadErr = err.Error()
			s.reloads.WithLabelValues("error").Inc()
			s.log.Error("certificate files changed but do not load: the last good certificate is still served", "listener", s.name, "err", err)
		} else {
			s.reloads.WithLabelValues("ok").Inc()
			s.log.Info("certificate reloaded", "listener", s.name, "cert_file", s.files.CertFile, "not_after", s.leaf.NotAfter)
		}
	}
	return s.cert, s.pool
}

// AEADSuites returns the TLS 1.2 cipher suites every listener offers (a new slice each call):
// forward-secret AEAD only (no CBC, no SHA-1 MAC, no RSA key exchange). TLS 1.3's suites are
// all AEAD, and not configurable.
func AEADSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

// Config returns the tls.Config of the listener: its certificate through GetCertificate, and for
// mutual TLS a check of the client's certificate against the current client CA (chain, validity
// dates, client-auth usage). Servers that add ALPN (gRPC, net/http) clone it.
func (s *Server) Config() *tls.Config {
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: AEADSuites(),
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, _ := s.current()
			return cert, nil
		},
	}
	if s.files.ClientCAFile != "" {
		// The check runs in VerifyConnection (after the handshake has the client's chain), not
		// through ClientCAs, so that a rotated CA file takes effect without a new tls.Config.
		c.ClientAuth = tls.RequestClientCert
		c.VerifyConnection = s.verifyClient
	}
	return c
}

func (s *Server) verifyClient(cs tls.ConnectionState) error {
	_, pool := s.current()
	err := VerifyClient(cs.PeerCertificates, pool, time.Now())
	if err != nil {
		s.refusals.Inc()
		s.mu.Lock()
		s.refused++
		s.lastRef = err.Error()
		s.mu.Unlock()
	}
	return err
}

// VerifyClient checks a client's chain (leaf first) against pool at now, for client
// authentication.
func VerifyClient(chain []*x509.Certificate, pool *x509.CertPool, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("tls: the client sent no certificate (mutual TLS: one from the client CA is required)")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return fmt.Errorf("tls: client certificate %q refused: %w", strings.Join(Identities(chain[0]), ","), err)
	}
	return nil
}

// Status is what /narwhal/state shows of a listener's TLS.
type Status struct {
	CertFile    string    `json:"cert_file"`
	Mutual      bool      `json:"mutual"` // clients need a certificate from client_ca_file
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"not_after"`
	LoadedAt    time.Time `json:"loaded_at"`
	ReloadError string    `json:"reload_error,omitempty"` // the last change that did not load
	Refused     uint64    `json:"refused"`                // handshakes refused for the client's certificate
	LastRefusal string    `json:"last_refusal,omitempty"`
}

// Status reloads changed files first, then reports.
func (s *Server) Status() Status {
	s.current()
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{CertFile: s.files.CertFile, Mutual: s.pool != nil, Subject: s.leaf.Subject.String(),
		NotAfter: s.leaf.NotAfter, LoadedAt: s.loadedAt, ReloadError: s.loadErr, Refused: s.refused, LastRefusal: s.lastRef}
}

// Client returns the tls.Config of a client that trusts caFile (the system's roots when "") and,
// when certFile is set, presents that certificate (mutual TLS). what prefixes errors (a flag or a
// config key).
func Client(what, caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := ReadPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: CA file: %w", what, err)
		}
		tc.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%s: a client certificate needs both its file and its key file", what)
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}

// Identities are the names a certificate stands for: its URI SANs (SPIFFE IDs) and DNS SANs, in
// that order; the subject common name only when it has neither (issuers police the SANs, while
// a requester often chooses the common name freely).
func Identities(c *x509.Certificate) []string {
	var ids []string
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, c.DNSNames...)
	if len(ids) == 0 && c.Subject.CommonName != "" {
		ids = append(ids, c.Subject.CommonName)
	}
	return ids
}

// Allowed reports whether the verified client certificate of a connection (its leaf) names one
// of allowed (Identities).
func Allowed(chain []*x509.Certificate, allowed map[string]bool) bool {
	if len(chain) == 0 {
		return false
	}
	for _, id := range Identities(chain[0]) {
		if allowed[id] {
			return true
		}
	}
	return false
}

// MaxLoggedRefusals bounds the refused clients a Refusals remembers as logged; beyond it
// refusals are counted only.
const MaxLoggedRefusals = 1024

// Refusals remembers which refusals were logged, so that a listener that refuses a client
// (the xDS allow-lists, the admin API's token, identities, origins and hosts) logs each client
// and reason once, and the memory stays bounded however many clients try. The zero value is
// ready.
type Refusals struct {
	mu     sync.Mutex
	logged map[string]bool
	full   bool
}

// Note records a refusal of who for why. first: this is the first of that client and reason,
// to be logged; full: the bound was reached with this one, to be said once (further refusals
// are only counted).
func (r *Refusals) Note(who, why string) (first, full bool) {
	key := why + "\x00" + who
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged[key] {
		return false, false
	}
	if len(r.logged) < MaxLoggedRefusals {
		if r.logged == nil {
			r.logged = map[string]bool{}
		}
		r.logged[key] = true
		return true, false
	}
	if !r.full {
		r.full = true
		return false, true
	}
	return false, false
}
