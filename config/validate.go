package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/narwhal-llm/narwhal/problem"
)

// Validate checks the rules that decoding cannot: ranges, enums, addresses, references
// between keys (engine profiles, fault engines) and the role floors. It returns problem.List,
// one problem.Problem per broken rule in a fixed order, or nil when the config is valid.
func (c *Config) Validate() error {
	if c == nil {
		return problem.List{{Msg: "config is nil"}}
	}
	if problems := c.check().visible(nil); len(problems) > 0 {
		return problem.List(problems)
	}
	return nil
}

// finding is a validation problem together with the paths whose values it depends on.
type finding struct {
	problem.Problem
	deps []string
}

type findings []finding

// visible drops the findings that depend on a path that could not be decoded (or on a
// path above or below one), so that one bad value does not cascade into nonsense.
func (fs findings) visible(tainted []string) []problem.Problem {
	var out []problem.Problem
	for _, f := range fs {
		if !dependsOnAny(f.deps, tainted) {
			out = append(out, f.Problem)
		}
	}
	return out
}

func dependsOnAny(deps, tainted []string) bool {
	for _, d := range deps {
		for _, t := range tainted {
			if related(d, t) {
				return true
			}
		}
	}
	return false
}

// related reports whether one dotted path is the other or lies under it.
func related(a, b string) bool { return a == b || under(a, b) || under(b, a) }

func under(p, parent string) bool {
	if parent == "" {
		return true
	}
	return len(p) > len(parent) && strings.HasPrefix(p, parent) && (p[len(parent)] == '.' || p[len(parent)] == '[')
}

// checker accumulates findings in the order the rules run.
type checker struct {
	out findings
}

// add records a problem at path; deps are the other paths the rule reads.
func (k *checker) add(path string, deps []string, format string, args ...any) {
	k.out = append(k.out, finding{
		Problem: problem.Problem{Path: path, Msg: fmt.Sprintf(format, args...)},
		deps:    append([]string{path}, deps...),
	})
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// gt requires v > lo.
func (k *checker) gt(path string, v, lo float64) bool {
	if v > lo {
		return true
	}
	k.add(path, nil, "must be > %s, got %s", num(lo), num(v))
	return false
}

// ge requires v >= lo.
func (k *checker) ge(path string, v, lo float64) bool {
	if v >= lo {
		return true
	}
	k.add(path, nil, "must be >= %s, got %s", num(lo), num(v))
	return false
}

// le requires v <= hi.
func (k *checker) le(path string, v, hi float64) bool {
	if v <= hi {
		return true
	}
	k.add(path, nil, "must be <= %s, got %s", num(hi), num(v))
	return false
}

// geInt requires v >= lo.
func (k *checker) geInt(path string, v, lo int64) bool {
	if v >= lo {
		return true
	}
	k.add(path, nil, "must be >= %d, got %d", lo, v)
	return false
}

// oneOf requires v to be one of allowed.
func (k *checker) oneOf(path, v string, allowed ...string) bool {
	if slices.Contains(allowed, v) {
		return true
	}
	k.add(path, nil, "must be %s, got %q", orList(allowed), v)
	return false
}

func orList(xs []string) string {
	if len(xs) == 2 {
		return xs[0] + " or " + xs[1]
	}
	return "one of " + strings.Join(xs, ", ")
}

// check runs every rule in schema order, then the fleet-wide role floors.
func (c *Config) check() findings {
	k := &checker{}
	k.listen(c.Listen)
	k.tls(c)
	k.adminAccess(c)
	k.geInt("admin.history.samples", int64(c.Admin.History.Samples), 1)
	k.gt("admin.history.interval_s", c.Admin.History.IntervalS, 0)
	k.geInt("admin.history.decisions", int64(c.Admin.History.Decisions), 1)
	k.ha(c.HA)
	k.slo(c.SLO)
	k.router(c.Router)
	k.controller(c.Controller)
	k.health(c.Health)
	k.xds(c.XDS)
	k.ge("shutdown_grace_s", c.ShutdownGraceS, 0)
	k.sim(c.Sim, c.Engines)
	k.profiles(c.Profiles)
	k.discovery(c)
	if len(c.Engines) == 0 && c.Discovery.Dynamic() {
		return k.out // the fleet comes from discovery: nothing to check yet
	}
	fleetOK := k.engines(c.Engines, c.Profiles)
	if fleetOK && !c.Discovery.Dynamic() {
		k.floors(c.Controller, c.Engines, c.Profiles)
	}
	return k.out
}

// adminAccess refuses an admin API open to other machines with no token: anyone who reaches it
// could drain engines and move roles.
func (k *checker) adminAccess(c *Config) {
	a := c.Admin
	if n := btoi(a.Token != "") + btoi(a.TokenFile != "") + btoi(a.TokenEnv != ""); n > 1 {
		k.add("admin.token", []string{"admin.token_file", "admin.token_env"}, "set one of token, token_file and token_env")
	}
	if a.Token != "" {
		if err := CheckToken(a.Token); err != nil {
			k.add("admin.token", nil, "%v; better, keep it out of the config: admin.token_file (a mounted secret) or admin.token_env", err)
		}
	}
	for i, h := range a.Hosts {
		if h == "" || strings.ContainsAny(h, ":/ @") {
			k.add(fmt.Sprintf("admin.hosts[%d]", i), nil, "%q is not a host name: give the name alone, with no scheme or port (narwhal.llm.svc)", h)
		}
	}
	if slices.ContainsFunc(k.out, func(f finding) bool { return f.Path == "listen.admin" }) {
		return // the address itself is wrong: that is the problem to fix first
	}
	if len(a.Identities) > 0 && !c.TLS.Admin.Mutual() {
		k.add("admin.identities", nil, "certificate identities need client certificates: set tls.admin.client_ca_file (and tls.admin.cert_file, key_file)")
	}
	for i, id := range a.Identities {
		if id == "" {
			k.add(fmt.Sprintf("admin.identities[%d]", i), nil, "must not be empty")
		}
	}
	// Mutual TLS stands for the token only with named identities: a CA shared with Envoy's
	// certificate would otherwise make every Envoy an admin.
	if OffLoopback(c.Listen.Admin) && !a.HasToken() && !(c.TLS.Admin.Mutual() && len(a.Identities) > 0) {
		k.add("listen.admin", []string{"admin.token"}, "%s is reachable from other machines and the admin API has no token: set admin.token (or admin.token_file, admin.token_env), require client certificates naming its operators (tls.admin.client_ca_file and admin.identities), or bind listen.admin to 127.0.0.1", c.Listen.Admin)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (k *checker) discovery(c *Config) {
	d := c.Discovery
	k.oneOf("discovery.switch", d.Switch, SwitchRouting, SwitchSGLang)
	if d.RoleLabel == "" {
		k.add("discovery.role_label", nil, "must not be empty")
	}
	if d.ProfileLabel == "" {
		k.add("discovery.profile_label", nil, "must not be empty")
	}
	if _, ok := c.Profiles[d.DefaultProfile]; d.DefaultProfile != "" && !ok {
		k.add("discovery.default_profile", nil, "unknown profile %q; known: %s", d.DefaultProfile, knownList(sortedNames(c.Profiles)))
	}
	if d.File.Path != "" {
		k.gt("discovery.file.resync_s", d.File.ResyncS, 0)
	}
	kc := d.Kubernetes
	if !kc.Enabled() {
		return
	}
	const p = "discovery.kubernetes"
	k.gt(p+".resync_s", kc.ResyncS, 0)
	switch {
	case kc.InferencePool != "" && (kc.Selector != "" || len(kc.Ports) > 0):
		k.add(p+".inference_pool", []string{p + ".selector", p + ".ports"}, "set either inference_pool or selector and ports, not both")
	case kc.InferencePool == "" && (kc.Selector == "" || len(kc.Ports) == 0):
		k.add(p, nil, "set selector and ports (the pods and their engine ports), or inference_pool")
	}
	if kc.Selector != "" {
		if _, err := labels.Parse(kc.Selector); err != nil {
			k.add(p+".selector", nil, "%v", err)
		}
	}
	for i, port := range kc.Ports {
		if port < 1 || port > 65535 {
			k.add(fmt.Sprintf("%s.ports[%d]", p, i), nil, "must be a port (1 to 65535), got %d", port)
		}
	}
	if kc.InferencePool != "" && !IsName(kc.InferencePool) {
		k.add(p+".inference_pool", nil, "must be an object name, got %q", kc.InferencePool)
	}
}

// CheckMember checks an engine that joins the fleet at run time (admin API, discovery): its id,
// address, switch method, role (prefill, decode, or "" for the controller to decide: then its
// profile must hold both) and profile, as the config's engines are checked.
func (c *Config) CheckMember(e Engine) error {
	var k checker
	k.engineID("engine", e.ID, 0, map[string]int{})
	k.engineAddress("engine", e, 0, map[string]int{}, []Engine{e})
	if e.Switch != "" {
		k.oneOf("engine.switch", e.Switch, SwitchRouting, SwitchSGLang)
	}
	k.engineHealth("engine", e.Health)
	if e.Role == "" {
		e.Role = e.OnlyRole()
	}
	if e.Role == "" {
		if p, ok := c.Profiles[e.Profile]; ok && (!p.CanHold(RolePrefill) || !p.CanHold(RoleDecode)) {
			k.add("engine.profile", nil, "profile %q cannot hold both roles, so the engine needs a role", e.Profile)
		} else {
			e.Role = RoleDecode // the profile check alone
			k.engineRole("engine", e, c.Profiles)
		}
	} else {
		k.engineRole("engine", e, c.Profiles)
	}
	if len(k.out) == 0 {
		return nil
	}
	ps := make(problem.List, len(k.out))
	for i, f := range k.out {
		ps[i] = f.Problem
	}
	return ps
}

func (k *checker) ha(h HA) {
	if !h.Enabled() {
		return
	}
	if len(h.Etcd.Endpoints) > 0 && h.Kubernetes.Namespace != "" {
		k.add("ha.kubernetes.namespace", []string{"ha.etcd.endpoints"}, "replicas share one store: set ha.etcd.endpoints or ha.kubernetes, not both")
	}
	if h.Kubernetes.Namespace != "" && !IsName(h.Kubernetes.Name) {
		k.add("ha.kubernetes.name", nil, "must be an object name, got %q", h.Kubernetes.Name)
	}
	tlsOn := h.Etcd.TLS != (EtcdTLS{})
	for i, e := range h.Etcd.Endpoints {
		u, err := url.Parse(e)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			k.add(fmt.Sprintf("ha.etcd.endpoints[%d]", i), nil, "must be an http:// or https:// URL of an etcd client endpoint, got %q", e)
		case tlsOn && u.Scheme == "http":
			// The etcd client dials an http:// endpoint in plaintext whatever its TLS config says.
			k.add(fmt.Sprintf("ha.etcd.endpoints[%d]", i), []string{"ha.etcd.tls"}, "%q is plaintext but ha.etcd.tls is set: the client would send the state and the lease to it unencrypted; use https://", e)
		}
	}
	if !strings.HasPrefix(h.Etcd.Prefix, "/") {
		k.add("ha.etcd.prefix", nil, "must start with /, got %q", h.Etcd.Prefix)
	}
	if h.LeaseTTLS < 1 {
		k.add("ha.lease_ttl_s", nil, "must be >= 1, got %d", h.LeaseTTLS)
	}
	if t := h.Etcd.TLS; (t.CertFile == "") != (t.KeyFile == "") {
		k.add("ha.etcd.tls", []string{"ha.etcd.tls.cert_file", "ha.etcd.tls.key_file"}, "cert_file and key_file go together")
	}
}

func (k *checker) listen(l Listen) {
	type listener struct {
		path string
		addr hostPort
	}
	var seen []listener
	for _, a := range []struct{ path, addr string }{
		{"listen.extproc", l.ExtProc}, {"listen.xds", l.XDS}, {"listen.admin", l.Admin}, {"listen.health", l.Health},
	} {
		if a.path == "listen.health" && a.addr == "" {
			continue // off
		}
		hp, msg := parseHostPort(a.addr, true)
		if msg != "" {
			k.add(a.path, nil, "%s", msg)
			continue
		}
		for _, prev := range seen {
			if hp.overlaps(prev.addr) {
				k.add(a.path, []string{prev.path}, "%q conflicts with %s (%q)", a.addr, prev.path, prev.addr.raw)
				break
			}
		}
		seen = append(seen, listener{a.path, hp})
	}
}

// hostPort is a parsed host:port; host is normalized (lower case, canonical IP form).
type hostPort struct {
	raw  string
	host string
	port int
}

// key is the normalized form two addresses are compared by.
func (h hostPort) key() string { return net.JoinHostPort(h.host, strconv.Itoa(h.port)) }

// overlaps reports whether two listen addresses would bind the same port on a shared host.
func (h hostPort) overlaps(o hostPort) bool {
	return h.port != 0 && h.port == o.port && (h.host == o.host || isAnyHost(h.host) || isAnyHost(o.host))
}

func isAnyHost(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }

// parseHostPort parses s as host:port with port 1-65535; the message says what is wrong. A
// listener's address may leave the host empty (every interface) and may have port 0 (a free
// port the system picks; serve logs the one it got).
func parseHostPort(s string, listener bool) (hostPort, string) {
	if s == "" {
		return hostPort{}, "must be host:port, got an empty string"
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return hostPort{}, fmt.Sprintf("must be host:port, got %q", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	switch {
	case err != nil && listener:
		return hostPort{}, fmt.Sprintf("port must be 0-65535, got %q in %q", port, s)
	case err != nil || p < 1 && !listener:
		return hostPort{}, fmt.Sprintf("port must be 1-65535, got %q in %q", port, s)
	}
	switch {
	case host == "" && !listener:
		return hostPort{}, fmt.Sprintf("host must not be empty, got %q", s)
	case host == "":
	case isIP(host):
		host = netip.MustParseAddr(host).Unmap().String()
	case isHostname(host):
		host = strings.ToLower(strings.TrimSuffix(host, "."))
	default:
		return hostPort{}, fmt.Sprintf("host must be an IP address or a host name, got %q in %q", host, s)
	}
	return hostPort{raw: s, host: host, port: int(p)}, ""
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// isHostname reports whether s is a DNS name: dot-separated labels of letters, digits,
// '-' and '_', none empty, starting or ending with '-', or longer than 63.
func isHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

func (k *checker) slo(s SLO) {
	k.gt("slo.ttft_s", s.TTFTS, 0)
	k.gt("slo.tpot_s", s.TPOTS, 0)
}

func (k *checker) router(r Router) {
	k.paths(r.Paths)
	k.geInt("router.body_limit_bytes", r.BodyLimitBytes, 1024)
	k.geInt("router.waiting_set.capacity", int64(r.WaitingSet.Capacity), 1)
	k.gt("router.waiting_set.max_wait_s", r.WaitingSet.MaxWaitS, 0)
	k.ge("router.admission.reject_ratio", r.Admission.RejectRatio, 0)
	short := k.gt("router.demand.short_horizon_s", r.Demand.ShortHorizonS, 0)
	long := k.gt("router.demand.long_horizon_s", r.Demand.LongHorizonS, 0)
	if short && long && r.Demand.ShortHorizonS > r.Demand.LongHorizonS {
		k.add("router.demand.short_horizon_s", []string{"router.demand.long_horizon_s"},
			"must be <= long_horizon_s (%s), got %s", num(r.Demand.LongHorizonS), num(r.Demand.ShortHorizonS))
	}
	k.geInt("router.default_output_tokens", int64(r.DefaultOutputTokens), 1)
	k.gt("router.first_token_timeout_s", r.FirstTokenTimeoutS, 0)
	k.oneOf("router.handoff", r.Handoff, HandoffDecode, HandoffPrefill)
	k.oneOf("router.local_prefill", r.LocalPrefill, LocalPrefillAuto, LocalPrefillOff, LocalPrefillAlways)
	k.geInt("router.local_prefill_max_tokens", int64(r.LocalPrefillMaxTokens), 1)
	k.oneOf("router.sizing.method", r.Sizing.Method, SizingBytes, SizingBPE)
	k.oneOf("router.sizing.encoding", r.Sizing.Encoding, Encodings...)
	k.geInt("router.sizing.non_text_tokens", int64(r.Sizing.NonTextTokens), 0)
	if r.PrefixAffinity.Enabled {
		k.geInt("router.prefix_affinity.block_tokens", int64(r.PrefixAffinity.BlockTokens), 1)
		k.geInt("router.prefix_affinity.entries", int64(r.PrefixAffinity.Entries), 1)
	}
}

func (k *checker) paths(paths []string) {
	if len(paths) == 0 {
		k.add("router.paths", nil, "must list at least one path")
		return
	}
	first := make(map[string]int)
	for i, p := range paths {
		path := fmt.Sprintf("router.paths[%d]", i)
		if !strings.HasPrefix(p, "/") {
			k.add(path, nil, "must start with \"/\", got %q", p)
			continue
		}
		if j, dup := first[p]; dup {
			other := fmt.Sprintf("router.paths[%d]", j)
			k.add(path, []string{other}, "duplicate of %s (%q)", other, p)
			continue
		}
		first[p] = i
	}
}

func (k *checker) controller(c Controller) {
	k.geInt("controller.min_prefill", int64(c.MinPrefill), 0)
	k.geInt("controller.min_decode", int64(c.MinDecode), 0)
	k.gt("controller.monitor.interval_s", c.Monitor.IntervalS, 0)
	k.geInt("controller.profile.min_samples", int64(c.Profile.MinSamples), 0)
	k.gt("controller.switch_timeout_s", c.SwitchTimeoutS, 0)
	k.reactive(c.Reactive)
	k.thresholds(c.Thresholds)
}

func (k *checker) reactive(r Reactive) {
	const p = "controller.reactive."
	step := k.gt(p+"step_s", r.StepS, 0)
	if k.ge(p+"urgent_delay_s", r.UrgentDelayS, 0) && step && r.UrgentDelayS >= r.StepS {
		k.add(p+"urgent_delay_s", []string{p + "step_s"}, "must be < step_s (%s), got %s", num(r.StepS), num(r.UrgentDelayS))
	}
	span := k.gt(p+"evidence_span_s", r.EvidenceSpanS, 0)
	k.geInt(p+"evidence_min_arrivals", int64(r.EvidenceMinArrivals), 0)
	if span && r.EvidenceMaxSpanS < r.EvidenceSpanS {
		k.add(p+"evidence_max_span_s", []string{p + "evidence_span_s"},
			"must be >= evidence_span_s (%s), got %s", num(r.EvidenceSpanS), num(r.EvidenceMaxSpanS))
	}
}

func (k *checker) thresholds(t Thresholds) {
	const p = "controller.thresholds."
	pair := k.band(p, t.Expand, t.Shrink)
	k.geInt(p+"confirm_passes", int64(t.ConfirmPasses), 1)
	k.ge(p+"min_gain", t.MinGain, 0)
	k.ge(p+"trend_tolerance", t.TrendTolerance, 0)
	k.ge(p+"cooldown_s", t.CooldownS, 0)
	k.ge(p+"dwell_s", t.DwellS, 0)
	k.geInt(p+"flip_resident_guard", int64(t.FlipResidentGuard), 0)
	ow := p + "open_window."
	if !k.band(ow, t.OpenWindow.Expand, t.OpenWindow.Shrink) || !pair {
		return
	}
	if t.OpenWindow.Expand < t.Expand {
		k.add(ow+"expand", []string{p + "expand"}, "must be >= thresholds.expand (%s), got %s", num(t.Expand), num(t.OpenWindow.Expand))
	}
	if t.OpenWindow.Shrink > t.Shrink {
		k.add(ow+"shrink", []string{p + "shrink"}, "must be <= thresholds.shrink (%s), got %s", num(t.Shrink), num(t.OpenWindow.Shrink))
	}
}

// band requires 0 < shrink < expand under prefix p.
func (k *checker) band(p string, expand, shrink float64) bool {
	if !k.gt(p+"shrink", shrink, 0) {
		return false
	}
	if shrink >= expand {
		k.add(p+"shrink", []string{p + "expand"}, "must be < expand (%s), got %s", num(expand), num(shrink))
		return false
	}
	return true
}

func (k *checker) health(h Health) {
	if !strings.HasPrefix(h.Path, "/") {
		k.add("health.path", nil, "must start with \"/\", got %q", h.Path)
	}
	interval := k.gt("health.interval_s", h.IntervalS, 0)
	if k.gt("health.timeout_s", h.TimeoutS, 0) && interval && h.TimeoutS > h.IntervalS {
		k.add("health.timeout_s", []string{"health.interval_s"}, "must be <= interval_s (%s), got %s", num(h.IntervalS), num(h.TimeoutS))
	}
	k.geInt("health.unhealthy_after", int64(h.UnhealthyAfter), 1)
	k.geInt("health.healthy_after", int64(h.HealthyAfter), 1)
	k.ge("health.recover_s", h.RecoverS, 0)
	k.geInt("health.passive.consecutive_failures", int64(h.Passive.ConsecutiveFailures), 0)
	if m := h.Metrics; k.ge("health.metrics.interval_s", m.IntervalS, 0) && m.IntervalS > 0 {
		if !strings.HasPrefix(m.Path, "/") {
			k.add("health.metrics.path", nil, "must start with \"/\", got %q", m.Path)
		}
		if k.gt("health.metrics.timeout_s", m.TimeoutS, 0) && m.TimeoutS > m.IntervalS {
			k.add("health.metrics.timeout_s", []string{"health.metrics.interval_s"}, "must be <= interval_s (%s), got %s", num(m.IntervalS), num(m.TimeoutS))
		}
	}
}

// tls checks each listener's files go together; identities need client certificates to read.
func (k *checker) tls(c *Config) {
	for _, l := range []struct {
		key string
		t   ListenerTLS
	}{{"tls.extproc", c.TLS.ExtProc}, {"tls.xds", c.TLS.XDS}, {"tls.admin", c.TLS.Admin}} {
		if (l.t.CertFile == "") != (l.t.KeyFile == "") {
			k.add(l.key, []string{l.key + ".cert_file", l.key + ".key_file"}, "cert_file and key_file go together")
		}
		if l.t.ClientCAFile != "" && l.t.CertFile == "" {
			k.add(l.key+".client_ca_file", nil, "mutual TLS needs the listener's own certificate: set %s.cert_file and %s.key_file", l.key, l.key)
		}
	}
	if len(c.XDS.Identities) > 0 && !c.TLS.XDS.Mutual() {
		k.add("xds.identities", nil, "certificate identities need client certificates: set tls.xds.client_ca_file (and tls.xds.cert_file, key_file)")
	}
	for i, n := range c.XDS.Nodes {
		if n == "" {
			k.add(fmt.Sprintf("xds.nodes[%d]", i), nil, "must not be empty")
		}
	}
	for i, n := range c.XDS.Identities {
		if n == "" {
			k.add(fmt.Sprintf("xds.identities[%d]", i), nil, "must not be empty")
		}
	}
}

func (k *checker) xds(x XDS) {
	const path = "xds.cluster_prefix"
	switch p := x.ClusterPrefix; {
	case p == "":
		k.add(path, nil, "must not be empty")
	case len(p) > 63:
		k.add(path, nil, "must be at most 63 characters, got %d", len(p))
	case p[0] == '-' || strings.IndexFunc(p, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') }) >= 0:
		k.add(path, nil, "must use only a-z 0-9 - and not start with '-', got %q", p)
	}
}

// Fault kinds (sim.faults[].kind).
var faultKinds = []string{"fail", "recover", "drain", "undrain"}

func (k *checker) sim(s Sim, engines []Engine) {
	if k.ge("sim.noise_sigma", s.NoiseSigma, 0) {
		k.le("sim.noise_sigma", s.NoiseSigma, 2)
	}
	k.gt("sim.truth.prefill_scale", s.Truth.PrefillScale, 0)
	k.gt("sim.truth.decode_scale", s.Truth.DecodeScale, 0)
	ids := make([]string, 0, len(engines))
	for _, e := range engines {
		ids = append(ids, e.ID)
	}
	for i, f := range s.Faults {
		p := fmt.Sprintf("sim.faults[%d].", i)
		k.ge(p+"at_s", f.AtS, 0)
		switch {
		case f.Engine == "":
			k.add(p+"engine", nil, "must name an engine")
		case !slices.Contains(ids, f.Engine):
			k.add(p+"engine", []string{"engines"}, "unknown engine %q; known: %s", f.Engine, knownList(ids))
		}
		k.oneOf(p+"kind", f.Kind, faultKinds...)
	}
}

func knownList(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	return strings.Join(xs, ", ")
}

// ProfileNames returns the names of the configured profiles, sorted.
func (c *Config) ProfileNames() []string { return sortedNames(c.Profiles) }

func sortedNames(profiles map[string]Profile) []string {
	names := make([]string, 0, len(profiles))
	for name := range profiles {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// CanHold reports whether the profile has the curve that role needs.
func (p *Profile) CanHold(role string) bool {
	switch role {
	case RolePrefill:
		return p.Prefill != nil
	case RoleDecode:
		return p.Decode != nil
	}
	return false
}

func (k *checker) profiles(profiles map[string]Profile) {
	for _, name := range sortedNames(profiles) {
		k.profile(problem.Key("profiles", name), name, profiles[name])
	}
}

func (k *checker) profile(path, name string, p Profile) {
	switch {
	case name == "":
		k.add(path, nil, "a profile name must not be empty")
	case !IsName(name):
		k.add(path, nil, "a profile name must use only A-Z a-z 0-9 . _ -, got %q", name)
	}
	if p.Prefill == nil && p.Decode == nil {
		k.add(path, nil, "must have a prefill curve, a decode curve or both")
	}
	if p.Prefill != nil {
		k.prefillCurve(path+".prefill", p.Prefill)
	}
	k.geInt(path+".prefill_concurrency", int64(p.PrefillConcurrency), 1)
	if p.Decode != nil {
		k.decodeCurve(path+".decode", p.Decode)
	}
	k.ge(path+".kv_transfer_s", p.KVTransferS, 0)
	k.geInt(path+".chunked_prefill.budget_tokens", int64(p.ChunkedPrefill.BudgetTokens), 0) // unused without a prefill curve
}

// prefillCurve requires non-negative coefficients and a curve that is finite, positive and
// increasing over [1, max_tokens]: a curve no slower at max_tokens than at one token is
// rejected as non-increasing.
func (k *checker) prefillCurve(path string, c *PrefillCurve) {
	ok := k.ge(path+".base_s", c.BaseS, 0)
	ok = k.ge(path+".per_token_s", c.PerTokenS, 0) && ok
	ok = k.ge(path+".per_token2_s", c.PerToken2S, 0) && ok
	ok = k.geInt(path+".max_tokens", int64(c.MaxTokens), 1) && ok
	if !ok {
		return
	}
	top := max(c.MaxTokens, 2)
	lo, hi := c.Seconds(1), c.Seconds(top)
	switch {
	case math.IsInf(hi, 0):
		k.add(path, nil, "curve overflows at %d tokens", top)
	case !(hi > lo):
		k.add(path, nil, "curve is non-increasing: %s s at 1 token, %s s at %d tokens (per_token_s or per_token2_s must be > 0)", num(lo), num(hi), top)
	case !(lo > 0):
		k.add(path, nil, "curve must be positive, got %s s at 1 token", num(lo))
	}
}

// decodeCurve requires a positive base, non-negative slopes, positive limits and a finite
// step time at the limits.
func (k *checker) decodeCurve(path string, c *DecodeCurve) {
	ok := k.gt(path+".base_s", c.BaseS, 0)
	ok = k.ge(path+".per_stream_s", c.PerStreamS, 0) && ok
	ok = k.ge(path+".per_kv_token_s", c.PerKVTokenS, 0) && ok
	ok = k.geInt(path+".max_streams", int64(c.MaxStreams), 1) && ok
	ok = k.geInt(path+".max_kv_tokens", int64(c.MaxKVTokens), 1) && ok
	if ok && math.IsInf(c.StepSeconds(c.MaxStreams, c.MaxKVTokens), 0) {
		k.add(path, nil, "curve overflows at max_streams and max_kv_tokens")
	}
}

// engines checks each engine and reports whether every engine has a valid role and a
// profile that can hold it (which the floor check needs).
func (k *checker) engines(engines []Engine, profiles map[string]Profile) bool {
	if len(engines) == 0 {
		k.add("engines", nil, "at least one engine is required")
		return false
	}
	ok := true
	ids := make(map[string]int)
	addrs := make(map[string]int)
	for i, e := range engines {
		p := fmt.Sprintf("engines[%d]", i)
		k.engineID(p, e.ID, i, ids)
		k.engineAddress(p, e, i, addrs, engines)
		if e.Switch != "" { // "" (an engine built in code) is routing
			k.oneOf(p+".switch", e.Switch, SwitchRouting, SwitchSGLang)
		}
		ok = k.engineRole(p, e, profiles) && ok
		k.engineHealth(p, e.Health)
	}
	return ok
}

func (k *checker) engineID(p, id string, i int, ids map[string]int) {
	switch j, dup := ids[id]; {
	case id == "":
		k.add(p+".id", nil, "must not be empty")
	case !IsName(id):
		k.add(p+".id", nil, "must use only A-Z a-z 0-9 . _ -, got %q", id)
	case dup:
		k.add(p+".id", []string{fmt.Sprintf("engines[%d].id", j)}, "duplicate id %q (also engines[%d])", id, j)
	default:
		ids[id] = i
	}
}

func (k *checker) engineAddress(p string, e Engine, i int, addrs map[string]int, engines []Engine) {
	hp, msg := parseHostPort(e.Address, false)
	if msg != "" {
		k.add(p+".address", nil, "%s", msg)
		return
	}
	if j, dup := addrs[hp.key()]; dup {
		k.add(p+".address", []string{fmt.Sprintf("engines[%d].address", j)},
			"%q is the same address as engines[%d] (%s, %q)", e.Address, j, engines[j].ID, engines[j].Address)
		return
	}
	addrs[hp.key()] = i
}

// engineRole checks the role and the profile, and that the profile has the role's curve.
// engineHealth checks an engine's probe target: a path that starts with /, a port in range.
func (k *checker) engineHealth(p string, h EngineHealth) {
	if h.Path != "" && !strings.HasPrefix(h.Path, "/") {
		k.add(p+".health.path", nil, "must start with /, got %q", h.Path)
	}
	if h.Port < 0 || h.Port > 65535 {
		k.add(p+".health.port", nil, "must be 1-65535 (0: the engine's own port), got %d", h.Port)
	}
}

func (k *checker) engineRole(p string, e Engine, profiles map[string]Profile) bool {
	roleOK := k.oneOf(p+".role", e.Role, RolePrefill, RoleDecode)
	for i, r := range e.Roles {
		switch {
		case !k.oneOf(fmt.Sprintf("%s.roles[%d]", p, i), r, RolePrefill, RoleDecode):
			roleOK = false
		case slices.Index(e.Roles, r) != i:
			k.add(fmt.Sprintf("%s.roles[%d]", p, i), nil, "%s is listed twice", r)
		}
	}
	if roleOK && len(e.Roles) > 0 && !slices.Contains(e.Roles, e.Role) {
		k.add(p+".role", []string{p + ".roles"}, "%s is not one of the roles the engine can play (%s)", e.Role, strings.Join(e.Roles, ", "))
		roleOK = false
	}
	prof, known := profiles[e.Profile]
	switch {
	case e.Profile == "":
		k.add(p+".profile", nil, "must name a profile; known: %s", knownList(sortedNames(profiles)))
		return false
	case !known:
		// A profile that failed to decode is still in the map, so only a failure of the
		// whole profiles mapping (related to this path) can make this a cascade.
		k.add(p+".profile", []string{problem.Key("profiles", e.Profile)}, "unknown profile %q; known: %s", e.Profile, knownList(sortedNames(profiles)))
		return false
	case roleOK && !prof.CanHold(e.Role):
		k.add(p+".profile", []string{p + ".role", problem.Key("profiles", e.Profile)},
			"profile %q has no %s curve, so it cannot hold role %s", e.Profile, e.Role, e.Role)
		return false
	}
	return roleOK
}

// fleetCounts sorts the engines by what roles they can take: pinned to a role, or unpinned
// and able to hold only prefill, only decode, or both.
type fleetCounts struct {
	pinned          map[string]int
	onlyPrefill     int
	onlyDecode      int
	both            int
	canHold         map[string]int
	unpinnedCanHold map[string]int
}

func countFleet(engines []Engine, profiles map[string]Profile) fleetCounts {
	fc := fleetCounts{pinned: map[string]int{}, canHold: map[string]int{}, unpinnedCanHold: map[string]int{}}
	for _, e := range engines {
		p := profiles[e.Profile]
		pre, dec := p.CanHold(RolePrefill) && e.CanPlay(RolePrefill), p.CanHold(RoleDecode) && e.CanPlay(RoleDecode)
		if pre {
			fc.canHold[RolePrefill]++
		}
		if dec {
			fc.canHold[RoleDecode]++
		}
		switch {
		case e.Pinned || e.OnlyRole() != "":
			fc.pinned[e.Role]++
		case pre && dec:
			fc.both++
		case pre:
			fc.onlyPrefill++
		default:
			fc.onlyDecode++
		}
	}
	return fc
}

// floors checks that the role floors can be met by the fleet: enough engines, enough
// engines whose profiles can hold each role, and, since pinned engines keep their roles,
// enough engines for each floor that are pinned to its role or free to take it.
func (k *checker) floors(c Controller, engines []Engine, profiles map[string]Profile) {
	if c.MinPrefill < 0 || c.MinDecode < 0 {
		return
	}
	deps := []string{"controller.min_prefill", "controller.min_decode", "engines", "profiles"}
	pairPath := "controller.min_decode"
	if c.MinDecode == 0 {
		pairPath = "controller.min_prefill"
	}
	if need := c.MinPrefill + c.MinDecode; need > len(engines) {
		k.add(pairPath, deps, "floors need %d engines (min_prefill %d + min_decode %d), fleet has %d",
			need, c.MinPrefill, c.MinDecode, len(engines))
		return
	}
	fc := countFleet(engines, profiles)
	floors := []struct {
		role, other string
		min, only   int
	}{
		{RolePrefill, RoleDecode, c.MinPrefill, fc.onlyPrefill},
		{RoleDecode, RolePrefill, c.MinDecode, fc.onlyDecode},
	}
	reported := false
	for _, f := range floors {
		if have := fc.canHold[f.role]; have < f.min {
			k.add("controller.min_"+f.role, deps, "floor %d cannot be met: engines that can play %s (a profile with its curve, engines[].roles): %d",
				f.min, f.role, have)
			reported = true
		}
	}
	if reported {
		return
	}
	for _, f := range floors {
		// With the fleet-size check above, each floor met on its own means both are met at
		// once: the floors compete only for the unpinned engines able to hold both roles,
		// and a fleet large enough for both floors has enough of those.
		if avail := fc.pinned[f.role] + f.only + fc.both; avail < f.min {
			k.add("controller.min_"+f.role, deps, "floor %d cannot be met: pinned engines keep their roles, leaving engines able to hold %s: %d (pinned to %s: %d)",
				f.min, f.role, avail, f.other, fc.pinned[f.other])
		}
	}
}
