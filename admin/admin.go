// Package admin serves Narwhal's admin HTTP API (README, "Admin API"): liveness and
// readiness, Prometheus metrics, /narwhal/state, and the engine lifecycle and pin calls.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/envoy"
	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/history"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// Options configure a Server.
type Options struct {
	Config   *config.Config
	Fleet    *fleet.Fleet
	Gatherer prometheus.Gatherer // served at /metrics
	Now      func() time.Time    // the clock of state times and fleet changes
	Start    time.Time           // when the process started (the evidence window opened)
	Logger   *slog.Logger
	// Router reports the data path's counters, demand and engine loads; nil before it runs.
	Router interface{ Snapshot() router.Snapshot }
	// Sizing reports the running sizing error per model; nil when not sizing.
	Sizing func() []extproc.SizingError
	// XDS reports the xDS server's clients, pushes and NACKs; nil without it.
	XDS interface{ Stats() envoy.Stats }
	// HA reports this replica's standing among replicas on etcd; nil for a single instance.
	HA func() HAState
	// Controller reports the last decisions and the arrival-evidence window; nil without it.
	Controller interface {
		Recent() []decisionlog.Decision
		Window() decisionlog.WindowState
		Advise(prefill, decode int, reason string) (decisionlog.Decision, error)
	}
	// Discovery reports the sources that add and remove engines at run time; nil without any.
	Discovery func() DiscoveryState
	// TLS reports each listener's certificate (tls.extproc, tls.xds, tls.admin), by listener;
	// nil when none serves TLS.
	TLS func() map[string]tlsfiles.Status
	// History is the history ring GET /narwhal/history serves; nil keeps none.
	History *history.Ring[decisionlog.Decision]
	// Registerer, when set, takes narwhal_admin_refused_total.
	Registerer prometheus.Registerer
}

// Server is the admin HTTP API. Create it with New; it is ready once SetReady(true).
type Server struct {
	o     Options
	token tokenSource
	// identities are admin.identities: a mutating call's client certificate must name one.
	identities map[string]bool
	// hosts are admin.hosts, lower case: the host names served besides loopback names and IP
	// addresses (docs/security.md, "The admin API").
	hosts    map[string]bool
	origins  http.CrossOriginProtection
	refusals tlsfiles.Refusals
	refused  *prometheus.CounterVec // by reason; nil without Options.Registerer
	ready    atomic.Bool
	mux      *http.ServeMux
}

// New builds the admin server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	// With a token file the first call reads it again (seen is the zero stamp): a rotation
	// between serve's read and this server's first call is not missed.
	s := &Server{o: o, mux: http.NewServeMux(), hosts: map[string]bool{},
		token: tokenSource{token: []byte(o.Config.Admin.Token), path: o.Config.Admin.TokenFile, log: o.Logger}}
	for _, h := range o.Config.Admin.Hosts {
		s.hosts[strings.ToLower(strings.TrimSuffix(h, "."))] = true
	}
	if o.Registerer != nil {
		s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "narwhal_admin_refused_total",
			Help: "Admin API calls refused, by reason: token, identity, origin, host, media_type."}, []string{"reason"})
		o.Registerer.MustRegister(s.refused)
	}
	if ids := o.Config.Admin.Identities; len(ids) > 0 {
		s.identities = map[string]bool{}
		for _, id := range ids {
			s.identities[id] = true
		}
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "ok") })
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn)}))
	s.mux.HandleFunc("GET /narwhal/state", s.state)
	s.mux.HandleFunc("GET /narwhal/history", s.history)
	s.mux.HandleFunc("GET /{$}", s.servePage)
	s.mux.HandleFunc("POST /narwhal/engines/{id}/{action}", s.engineAction)
	s.mux.HandleFunc("POST /narwhal/engines", s.addEngine)
	s.mux.HandleFunc("DELETE /narwhal/engines/{id}", s.removeEngine)
	s.mux.HandleFunc("POST /narwhal/advise", s.advise)
	return s
}

// ServeHTTP implements http.Handler. A request for a host name this API does not serve (DNS
// rebinding: a web page's own name pointed at this address) is answered 421, and a browser's
// cross-origin request that would change something 403, before any route (docs/security.md,
// "The admin API"). What no route serves (404, or 405 with its Allow header) is answered as
// JSON too, like every other error.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if host, ok := s.servesHost(r.Host); !ok {
		s.refuse(w, r, http.StatusMisdirectedRequest, "host", "misdirected_request",
			"this admin API does not serve the host "+quote(host)+": use a loopback name or an IP address, or list the name in admin.hosts")
		return
	}
	if err := s.origins.Check(r); err != nil {
		s.refuse(w, r, http.StatusForbidden, "origin", "forbidden",
			"a cross-origin request may not change anything here: call the admin API from a client that is not a web page of another site (curl, narwhal), or from its own page")
		return
	}
	if _, pattern := s.mux.Handler(r); pattern != "" {
		s.mux.ServeHTTP(w, r)
		return
	}
	st := &statusOnly{header: http.Header{}}
	s.mux.ServeHTTP(st, r)
	if allow := st.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	switch st.code {
	case http.StatusMethodNotAllowed:
		writeError(w, st.code, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, st.header.Get("Allow")))
	default:
		writeError(w, http.StatusNotFound, "not_found", "no such path: "+r.URL.Path)
	}
}

// statusOnly keeps the status and headers of the mux's own reply, and drops its text body.
type statusOnly struct {
	header http.Header
	code   int
}

func (s *statusOnly) Header() http.Header         { return s.header }
func (s *statusOnly) Write(p []byte) (int, error) { return len(p), nil }
func (s *statusOnly) WriteHeader(code int)        { s.code = code }

// SetReady sets what /readyz answers: ready once the config is loaded and every server
// listens; not ready again while shutting down.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		writeText(w, http.StatusServiceUnavailable, "not ready")
		return
	}
	writeText(w, http.StatusOK, "ready")
}

// Snapshot returns the state as /narwhal/state shows it.
func (s *Server) Snapshot() State {
	snap := s.o.Fleet.Snapshot()
	st := State{
		Time:           rfc3339(s.o.Now()),
		Advisory:       s.o.Config.Controller.Advisory,
		EvidenceWindow: EvidenceWindow{Open: true, OpenedAt: rfc3339(s.o.Start)},
		Sizing:         []SizingState{},
		Decisions:      []decisionlog.Decision{},
	}
	if s.o.Controller != nil {
		w := s.o.Controller.Window()
		st.EvidenceWindow = EvidenceWindow{Open: w.Open, OpenedAt: rfc3339(s.o.Start.Add(config.Seconds(w.OpenedAtS))), Arrivals: int(w.Arrivals)}
		if d := s.o.Controller.Recent(); d != nil {
			st.Decisions = d
		}
	}
	var loads []router.EngineLoad
	if s.o.Router != nil {
		rs := s.o.Router.Snapshot()
		st.Counters, st.Retained, st.Demand, st.Fallback, loads = rs.Counters, rs.Retained, rs.Demand, rs.Fallback, rs.Engines
	}
	if s.o.Sizing != nil {
		for _, e := range s.o.Sizing() {
			st.Sizing = append(st.Sizing, SizingState{Model: e.Model, Samples: e.Samples, MAPE: e.MAPE, Bias: e.Bias, BytesPerToken: e.BytesPerToken})
		}
	}
	if s.o.TLS != nil {
		st.TLS = s.o.TLS()
	}
	if s.o.Discovery != nil {
		d := s.o.Discovery()
		st.Discovery = &d
	}
	if s.o.XDS != nil {
		x := s.o.XDS.Stats()
		st.XDS = &x
	}
	if s.o.HA != nil {
		h := s.o.HA()
		st.HA = &h
	}
	fleetState(&st, &snap, loads)
	return st
}

func (s *Server) state(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Snapshot())
}

// advise serves POST /narwhal/advise: {"prefill": P, "decode": D, "reason": "..."} is evaluated
// as an advisory decision and its record returned. Nothing moves.
func (s *Server) advise(w http.ResponseWriter, r *http.Request) {
	if s.guard(w, r) || s.jsonBody(w, r) {
		return
	}
	if s.o.Controller == nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the role controller is not running")
		return
	}
	var req struct {
		Prefill *int   `json:"prefill"`
		Decode  *int   `json:"decode"`
		Reason  string `json:"reason"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Prefill == nil || req.Decode == nil {
		msg := `the body must be {"prefill": P, "decode": D, "reason": "..."}`
		if err != nil {
			msg += ": " + err.Error()
		}
		writeError(w, http.StatusBadRequest, "invalid_request", msg)
		return
	}
	d, err := s.o.Controller.Advise(*req.Prefill, *req.Decode, req.Reason)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	s.o.Logger.Info("admin", "action", "advise", "prefill", *req.Prefill, "decode", *req.Decode, "result", d.AdvisoryResult, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, d)
}

// engineAction serves POST /narwhal/engines/{id}/{drain|undrain|pin|unpin}.
func (s *Server) engineAction(w http.ResponseWriter, r *http.Request) {
	if s.guard(w, r) {
		return
	}
	id, action := r.PathValue("id"), r.PathValue("action")
	now := s.o.Now()
	var (
		e     fleet.Engine
		err   error
		floor *fleet.FloorError
	)
	switch action {
	case "drain":
		// A drain that would leave a pool under its floor is refused unless forced: placement
		// would answer that role's requests 503 until the floor repair moved another engine in
		// (README, "Admin API").
		var floors fleet.Floors
		if r.URL.Query().Get("force") != "true" {
			floors = fleet.Floors{Prefill: s.o.Config.Controller.MinPrefill, Decode: s.o.Config.Controller.MinDecode}
		}
		e, err = s.o.Fleet.Drain(id, now, "admin", floors)
	case "undrain":
		e, err = s.o.Fleet.Undrain(id, now, "admin")
	case "pin":
		e, err = s.o.Fleet.SetPinned(id, true, now, "admin")
	case "unpin":
		e, err = s.o.Fleet.SetPinned(id, false, now, "admin")
	default:
		writeError(w, http.StatusNotFound, "not_found", "unknown action "+quote(action)+"; want drain, undrain, pin or unpin")
		return
	}
	switch {
	case errors.Is(err, fleet.ErrUnknownEngine):
		writeError(w, http.StatusNotFound, "unknown_engine", "no engine "+quote(id))
	case errors.Is(err, fleet.ErrTransition):
		writeError(w, http.StatusConflict, "conflict", err.Error())
	case errors.As(err, &floor):
		key := "controller.min_prefill"
		if floor.Role == fleet.Decode {
			key = "controller.min_decode"
		}
		writeError(w, http.StatusConflict, "below_floor", fmt.Sprintf("%s (%s): requests would be answered 503 no_capacity until the floor repair moved another engine in. "+
			"Drain it once another engine is %s (the controller moves one when demand asks, or add one: POST /narwhal/engines), or drain it anyway: POST /narwhal/engines/%s/drain?force=true",
			floor, key, floor.Role, floor.Engine))
	case err != nil:
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	default:
		s.o.Logger.Info("admin", "action", action, "engine", id, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusOK, engineState(&e))
	}
}

// SourceAdmin is the fleet.Engine.Source of the engines the admin API adds.
const SourceAdmin = "admin"

// guard answers a call that changes the fleet when it may not run here: no or a wrong token
// (401), a client certificate naming none of admin.identities (403), a standby replica (503).
// It reports whether it answered.
func (s *Server) guard(w http.ResponseWriter, r *http.Request) bool {
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="narwhal"`)
		s.refuse(w, r, http.StatusUnauthorized, "token", "unauthorized", "this call needs Authorization: Bearer <admin.token>")
		return true
	}
	if s.identities != nil && (r.TLS == nil || !tlsfiles.Allowed(r.TLS.PeerCertificates, s.identities)) {
		s.refuse(w, r, http.StatusForbidden, "identity", "forbidden", "this call needs a client certificate naming one of admin.identities")
		return true
	}
	return s.standby(w)
}

// jsonBody answers 415 a call whose body is not declared application/json (a web form or a
// text/plain post, which a browser sends to any site without asking it first); it reports
// whether it answered.
func (s *Server) jsonBody(w http.ResponseWriter, r *http.Request) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == "application/json" {
		return false
	}
	s.refuse(w, r, http.StatusUnsupportedMediaType, "media_type", "unsupported_media_type", "the body must be JSON, sent with Content-Type: application/json")
	return true
}

// refuse answers a refused call, counts it by reason and logs it once per client address and
// reason (tlsfiles.Refusals: bounded, then counted only).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, reason, kind, msg string) {
	if s.refused != nil {
		s.refused.WithLabelValues(reason).Inc()
	}
	client := r.RemoteAddr
	if h, _, err := net.SplitHostPort(client); err == nil {
		client = h
	}
	switch first, full := s.refusals.Note(client, reason); {
	case first:
		s.o.Logger.Warn("admin: call refused (logged once per client and reason)", "client", client, "reason", reason,
			"status", code, "method", r.Method, "path", r.URL.Path, "host", r.Host, "origin", r.Header.Get("Origin"))
	case full:
		s.o.Logger.Warn("admin: more distinct clients refused than are logged one by one: further ones are only counted (narwhal_admin_refused_total)",
			"logged", tlsfiles.MaxLoggedRefusals)
	}
	writeError(w, code, kind, msg)
}

// servesHost reports whether a request's Host names this API: an IP address (a browser that
// sends one reached it by that address, not by a name a web page controls), a loopback name
// (localhost, *.localhost), or a name of admin.hosts. An empty Host (HTTP/1.0) is served: no
// browser sends one. It returns the host without its port.
func (s *Server) servesHost(hostport string) (string, bool) {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	switch {
	case host == "", host == "localhost", strings.HasSuffix(host, ".localhost"):
		return host, true
	case isIP(host):
		return host, true
	}
	return host, s.hosts[host]
}

// addEngine serves POST /narwhal/engines: an engine joins the fleet at run time (docs/discovery.md),
// recovering until its probes pass. Body: {"id", "address", "role" (prefill, decode; none: the
// controller decides), "profile" (none: discovery.default_profile), "switch" (none:
// discovery.switch)}.
func (s *Server) addEngine(w http.ResponseWriter, r *http.Request) {
	if s.guard(w, r) || s.jsonBody(w, r) {
		return
	}
	var req config.Engine
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", `the body must be {"id": "...", "address": "host:port", "role": "prefill|decode", "profile": "...", "switch": "routing|sglang"}: `+err.Error())
		return
	}
	if req.Profile == "" {
		req.Profile = s.o.Config.DiscoveredProfile("")
	}
	if req.Switch == "" {
		req.Switch = s.o.Config.Discovery.Switch
	}
	if err := s.o.Config.CheckMember(req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	e, err := s.o.Fleet.Add(req, SourceAdmin, s.o.Now())
	if err != nil {
		writeError(w, http.StatusConflict, "conflict", err.Error())
		return
	}
	s.o.Logger.Info("admin", "action", "add", "engine", e.ID, "address", e.Address, "role", req.Role, "profile", e.Profile, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusCreated, engineState(&e))
}

// removeEngine serves DELETE /narwhal/engines/{id}: an engine the admin API added leaves the
// fleet at once (its residents finish). An engine of the config or of a discovery source is
// removed there, where it would come back from.
func (s *Server) removeEngine(w http.ResponseWriter, r *http.Request) {
	if s.guard(w, r) {
		return
	}
	id := r.PathValue("id")
	e, ok := s.o.Fleet.Engine(id)
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, "unknown_engine", "no engine "+quote(id))
		return
	case e.Source != SourceAdmin:
		writeError(w, http.StatusConflict, "conflict", fmt.Sprintf("engine %s comes from %s: remove it there (the admin API removes the engines it added)", id, e.Source))
		return
	}
	e, err := s.o.Fleet.Remove(id, s.o.Now(), SourceAdmin)
	if err != nil {
		writeError(w, http.StatusNotFound, "unknown_engine", err.Error())
		return
	}
	s.o.Logger.Info("admin", "action", "remove", "engine", id, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, engineState(&e))
}

// standby answers a call that changes the fleet or asks the controller 503 not_leader on a
// replica that stands by (its view follows the leader's state, which would overwrite the
// change), naming the leader; it reports whether it answered.
func (s *Server) standby(w http.ResponseWriter) bool {
	if s.o.HA == nil {
		return false
	}
	h := s.o.HA()
	if h.Role == "leader" {
		return false
	}
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "not_leader", "this replica ("+h.ID+") stands by; send the call to the leader, "+quote(h.Leader))
	return true
}

// authorized checks the bearer token in constant time; with no token configured every call is.
// A token file that never held a usable token authorizes nothing (it fails closed).
func (s *Server) authorized(r *http.Request) bool {
	token := s.token.current()
	if len(token) == 0 {
		return s.token.path == ""
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), token) == 1
}

// isIP reports whether host is an IP address (an IPv6 one with its zone too).
func isIP(host string) bool {
	_, err := netip.ParseAddr(host)
	return err == nil
}

// tokenSource is the admin token: the one resolved at start (Config.Admin.Token), and with
// admin.token_file, the file's again whenever it changes (its size, modification time or inode,
// as the certificates are watched: a rotated Secret takes effect at the next call). A change
// that holds no usable token keeps the last good one and is logged; the token is never logged.
type tokenSource struct {
	path string
	log  *slog.Logger

	mu    sync.Mutex
	seen  tlsfiles.FileStamp
	token []byte
}

func (t *tokenSource) current() []byte {
	if t.path == "" {
		return t.token
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := tlsfiles.Stamp(t.path); st != t.seen {
		t.seen = st
		if tok, err := (config.Admin{TokenFile: t.path}).ResolveToken(); err != nil {
			t.log.Error("admin.token_file changed but holds no usable token: the last good token still stands", "err", err)
		} else {
			t.token = []byte(tok)
			t.log.Info("admin token reloaded", "token_file", t.path)
		}
	}
	return t.token
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func writeText(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write([]byte(msg + "\n"))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeError writes an OpenAI-style error, the shape every Narwhal error body has.
func writeError(w http.ResponseWriter, code int, kind, msg string) {
	type body struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	writeJSON(w, code, map[string]body{"error": {Message: msg, Type: kind, Code: kind}})
}

// Limits bound what one client may hold of the admin listener, which also answers the kubelet's
// probes (docs/security.md, "The admin API"): the time to send the request's headers and its
// whole body, the time to take the answer, an idle keep-alive connection's life, and the
// headers' size.
type Limits struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
}

// DefaultLimits are the admin listener's: a request (its bodies are at most 64 kB) within 15 s,
// its answer taken within 30 s (the history at its largest is a few MB), a keep-alive connection
// idle for a minute at most, headers of 64 kB at most.
var DefaultLimits = Limits{ReadHeader: 10 * time.Second, Read: 15 * time.Second, Write: 30 * time.Second,
	Idle: time.Minute, MaxHeaderBytes: 64 << 10}

// HTTPServer is the admin listener's http.Server for h, with these limits.
func (l Limits) HTTPServer(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes, ErrorLog: errorLog}
}
