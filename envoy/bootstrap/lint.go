package bootstrap

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/problem"
	"github.com/narwhal-llm/narwhal/wire"
)

// Names and defaults the lint rules and the generated bootstrap share.
const (
	// OriginalDstCluster, ExtProcCluster and XDSCluster are the static clusters of the generated
	// bootstrap: the ORIGINAL_DST cluster placed requests go through, Narwhal's ext_proc server
	// and Narwhal's ADS server.
	OriginalDstCluster = "narwhal-original-dst"
	ExtProcCluster     = "narwhal-extproc"
	XDSCluster         = "narwhal-xds"

	extProcFilterType = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
	routerFilterType  = "envoy.extensions.filters.http.router.v3.Router"
	hcmFilterType     = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	httpOptionsKey    = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

	envoyDefaultBufferLimit    = 1 << 20                // per_connection_buffer_limit_bytes default
	envoyDefaultMessageTimeout = 200 * time.Millisecond // ext_proc message_timeout default
	envoyDefaultStreamIdle     = 5 * time.Minute        // HCM stream_idle_timeout default
	envoyDefaultBreaker        = 1024                   // circuit breaker thresholds default
)

// lintBootstrap applies the rules protos cannot express. Paths are canonical (proto names).
//
// Rules without a Narwhal config:
//   - dynamic_resources.ads_config: GRPC or DELTA_GRPC, transport V3, one envoy_grpc service whose
//     cluster is static and speaks HTTP/2; cds_config through ADS; no LDS or RDS through ADS
//     (Narwhal serves clusters and endpoints only);
//   - every static cluster name is unique; an ORIGINAL_DST cluster has lb_policy CLUSTER_PROVIDED
//     and original_dst_lb_config {use_http_header: true, http_header_name:
//     x-gateway-destination-endpoint}; subset selectors (and default_subset) use only the key
//     "role"; route metadata_match only filter_metadata "envoy.lb" {role: prefill|decode};
//   - every HTTP connection manager has an inline route_config, ends with the router filter, and
//     any ext_proc filter comes before it;
//   - the ext_proc filter (and every per-route override): grpc_service (not http_service) to a
//     static HTTP/2 cluster with exactly one endpoint; request headers SEND; request body BUFFERED
//     or FULL_DUPLEX_STREAMED (STREAMED, NONE, BUFFERED_PARTIAL, GRPC rejected); full duplex with
//     request_trailer_mode SEND; response headers SEND; response body STREAMED (or
//     FULL_DUPLEX_STREAMED with response_trailer_mode SEND); failure_mode_allow false;
//     allow_mode_override true; "envoy.lb" among metadata_options.receiving_namespaces.untyped;
//     no observability_mode, no disable_immediate_response, no async_mode; mutation rules that
//     let Narwhal's headers through;
//   - every cluster a route names (cluster, weighted_clusters, request mirrors) exists statically
//     or comes from Narwhal's CDS (then the static route_config needs validate_clusters: false);
//     no cluster_header route when an ORIGINAL_DST cluster exists;
//   - a route to an ORIGINAL_DST cluster is processed by ext_proc (not disabled per route or by
//     default), matches by exact, case-sensitive `path`, and sets a route timeout;
//   - the bootstrap has an ext_proc filter and an ORIGINAL_DST cluster.
//
// Rules with a Narwhal config: the ext_proc cluster is at listen.extproc and the ADS cluster at
// listen.xds (same port; same host unless Narwhal listens on every interface); message_timeout
// above router.waiting_set.max_wait_s (not in full duplex); stream_idle_timeout, request_timeout
// and route idle_timeout above it too; the request buffer limit of every placed route covers
// router.body_limit_bytes; the ext_proc cluster's circuit breakers (max_requests,
// max_pending_requests) cover router.waiting_set.capacity plus the fleet's in-flight streams,
// the ORIGINAL_DST cluster's (max_connections, max_requests) the fleet's in-flight streams; a
// route to ORIGINAL_DST matches one of router.paths, and POST to each of router.paths reaches
// such a route in every virtual host; route clusters from CDS are <prefix>-prefill, -decode or
// -engines, which no static cluster may shadow, and static EDS clusters fed by ADS subscribe to
// one of them.
func lintBootstrap(b *bootstrapv3.Bootstrap, cfg *config.Config) []problem.Problem {
	l := &linter{b: b, cfg: cfg, clusters: map[string]lintCluster{}, extProcRefs: map[string]string{}}
	l.indexClusters()
	l.dynamicResources()
	for _, c := range l.clusterList {
		l.cluster(c)
	}
	for i, ln := range b.GetStaticResources().GetListeners() {
		l.listener(ln, problem.Index("static_resources.listeners", i))
	}
	l.extProcClusters()
	if !l.sawExtProc {
		l.add("static_resources.listeners", "no envoy.filters.http.ext_proc filter (%s) in any listener: Envoy would never ask Narwhal where a request goes", extProcFilterType)
	}
	if len(l.originalDst) == 0 {
		l.add("static_resources.clusters", "no ORIGINAL_DST cluster: Envoy cannot send a request to the engine Narwhal names in %s (add %s, type ORIGINAL_DST, lb_policy CLUSTER_PROVIDED)", wire.HeaderDestination, OriginalDstCluster)
	}
	return dedupe(l.out)
}

type lintCluster struct {
	c    *clusterv3.Cluster
	path string
}

type linter struct {
	b           *bootstrapv3.Bootstrap
	cfg         *config.Config
	out         []problem.Problem
	clusters    map[string]lintCluster
	clusterList []lintCluster
	originalDst []string
	cdsADS      bool              // cds_config is ADS
	extProcRefs map[string]string // ext_proc gRPC cluster → path of its first reference
	sawExtProc  bool
}

func (l *linter) add(path, format string, args ...any) {
	l.out = append(l.out, problem.Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func dedupe(ps []problem.Problem) []problem.Problem {
	seen := map[string]bool{}
	out := ps[:0]
	for _, p := range ps {
		k := p.Path + "\x00" + p.Msg
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// Clusters

// narwhalClusters are the clusters Narwhal's ADS publishes for cfg (nil without a config).
func (l *linter) narwhalClusters() []string {
	if l.cfg == nil {
		return nil
	}
	names := wire.Names(l.cfg.XDS.ClusterPrefix).List()
	return names[:]
}

// fromCDS reports whether name can be a cluster Narwhal publishes over CDS.
func (l *linter) fromCDS(name string) bool {
	if !l.cdsADS {
		return false
	}
	if l.cfg == nil {
		return strings.HasSuffix(name, "-prefill") || strings.HasSuffix(name, "-decode") || strings.HasSuffix(name, "-engines")
	}
	return slices.Contains(l.narwhalClusters(), name)
}

func (l *linter) indexClusters() {
	for i, c := range l.b.GetStaticResources().GetClusters() {
		lc := lintCluster{c: c, path: problem.Index("static_resources.clusters", i)}
		if prev, dup := l.clusters[c.GetName()]; dup {
			l.add(problem.Key(lc.path, "name"), "cluster %q is defined twice (also at %s)", c.GetName(), prev.path)
			continue
		}
		l.clusters[c.GetName()] = lc
		l.clusterList = append(l.clusterList, lc)
		if c.GetType() == clusterv3.Cluster_ORIGINAL_DST && c.GetClusterType() == nil {
			l.originalDst = append(l.originalDst, c.GetName())
		}
	}
}

func (l *linter) isOriginalDst(name string) bool { return slices.Contains(l.originalDst, name) }

func (l *linter) cluster(lc lintCluster) {
	c, p := lc.c, lc.path
	if slices.Contains(l.narwhalClusters(), c.GetName()) {
		l.add(problem.Key(p, "name"), "%q is a cluster Narwhal publishes over CDS (xds.cluster_prefix %q); Envoy refuses a CDS update of a static cluster, so the whole update would be rejected: rename this one",
			c.GetName(), l.cfg.XDS.ClusterPrefix)
	}
	if l.isOriginalDst(c.GetName()) {
		l.originalDstCluster(lc)
	}
	if sc := c.GetLbSubsetConfig(); sc != nil {
		sp := problem.Key(p, "lb_subset_config")
		for i, sel := range sc.GetSubsetSelectors() {
			for j, k := range sel.GetKeys() {
				if k != wire.LBRoleKey {
					l.add(problem.Index(problem.Key(problem.Index(problem.Key(sp, "subset_selectors"), i), "keys"), j),
						"subset key %q: the subset load balancer reads endpoint filter_metadata[%q], where Narwhal publishes only %q (engine_id, lifecycle and pinned are under \"narwhal\", which it does not read)", k, wire.LBNamespace, wire.LBRoleKey)
				}
			}
		}
		for k := range sortedStruct(sc.GetDefaultSubset()) {
			if k != wire.LBRoleKey {
				l.add(problem.Key(problem.Key(sp, "default_subset"), k), "subset key %q: Narwhal publishes only %q under filter_metadata[%q]", k, wire.LBRoleKey, wire.LBNamespace)
			}
		}
	}
	if c.GetType() == clusterv3.Cluster_EDS && c.GetClusterType() == nil {
		eds := c.GetEdsClusterConfig()
		if eds.GetEdsConfig().GetAds() != nil {
			if l.b.GetDynamicResources().GetAdsConfig() == nil {
				l.add(problem.Fields(p, "eds_cluster_config.eds_config.ads"), "takes endpoints from ADS, but dynamic_resources.ads_config is not set")
			}
			svc := eds.GetServiceName()
			if svc == "" {
				svc = c.GetName()
			}
			if names := l.narwhalClusters(); names != nil && !slices.Contains(names, svc) {
				l.add(problem.Fields(p, "eds_cluster_config.service_name"), "subscribes to endpoints %q over ADS, but Narwhal publishes only %s", svc, strings.Join(names, ", "))
			}
		}
	}
}

func (l *linter) originalDstCluster(lc lintCluster) {
	c, p := lc.c, lc.path
	if c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED {
		l.add(problem.Key(p, "lb_policy"), "is %s, but an ORIGINAL_DST cluster needs CLUSTER_PROVIDED (Envoy refuses any other)", c.GetLbPolicy())
	}
	od := c.GetOriginalDstLbConfig()
	switch {
	case od == nil:
		l.add(problem.Key(p, "original_dst_lb_config"), "missing: set {use_http_header: true, http_header_name: %s} so the cluster sends each request to the engine Narwhal names", wire.HeaderDestination)
	case !od.GetUseHttpHeader():
		l.add(problem.Fields(p, "original_dst_lb_config.use_http_header"), "must be true: the destination is the %s header Narwhal sets", wire.HeaderDestination)
	case !validHeaderName(od.GetHttpHeaderName()):
		l.add(problem.Fields(p, "original_dst_lb_config.http_header_name"), "%q is not a valid HTTP header name; Narwhal names the destination in %s", od.GetHttpHeaderName(), wire.HeaderDestination)
	case od.GetHttpHeaderName() != wire.HeaderDestination:
		name := od.GetHttpHeaderName()
		if name == "" {
			name = "x-envoy-original-dst-host (the default)"
		}
		l.add(problem.Fields(p, "original_dst_lb_config.http_header_name"), "is %s, but Narwhal names the destination in %s", name, wire.HeaderDestination)
	}
	if l.cfg != nil {
		need := fleetStreams(l.cfg)
		l.breakers(lc, need, fmt.Sprintf("the fleet's in-flight streams (%d: decode max_streams plus prefill_concurrency of every engine; each HTTP/1.1 request to an engine holds a connection)", need),
			"max_connections", "max_requests")
	}
}

// validHeaderName reports whether s is empty (Envoy's default) or an HTTP header name (RFC 9110
// token characters).
func validHeaderName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

// fleetStreams bounds the requests in flight to engines: every engine's decode max_streams plus
// its prefill_concurrency.
func fleetStreams(cfg *config.Config) int {
	n := 0
	for _, e := range cfg.Engines {
		n += profileStreams(cfg.Profiles[e.Profile])
	}
	return n
}

// profileStreams bounds the requests in flight to one engine of profile p.
func profileStreams(p config.Profile) int {
	n := 0
	if p.Decode != nil {
		n += p.Decode.MaxStreams
	}
	if p.Prefill != nil {
		n += p.PrefillConcurrency
	}
	return n
}

// breakers checks the DEFAULT priority circuit breaker thresholds of a cluster.
func (l *linter) breakers(lc lintCluster, need int, why string, fields ...string) {
	p := problem.Key(lc.path, "circuit_breakers")
	var th *clusterv3.CircuitBreakers_Thresholds
	for i, t := range lc.c.GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() == corev3.RoutingPriority_DEFAULT {
			th, p = t, problem.Index(problem.Key(p, "thresholds"), i)
			break
		}
	}
	for _, f := range fields {
		v := uint64(envoyDefaultBreaker)
		if th != nil {
			if x := protoUint(th, f); x != nil {
				v = *x
			}
		}
		if v < uint64(need) {
			fp := problem.Key(p, f)
			if th == nil {
				fp = p
			}
			l.add(fp, "%s is %d (1024 when unset), below %s: requests beyond it fail with 503 overflow; raise it to at least %d", f, v, why, need)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Dynamic resources (ADS)

func (l *linter) dynamicResources() {
	dr := l.b.GetDynamicResources()
	ads := dr.GetAdsConfig()
	if ads == nil {
		l.add("dynamic_resources.ads_config", "missing: Narwhal publishes the engines and their roles over ADS (listen.xds); set {api_type: GRPC, transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: %s}}]}", XDSCluster)
	} else {
		p := "dynamic_resources.ads_config"
		if t := ads.GetApiType(); t != corev3.ApiConfigSource_GRPC && t != corev3.ApiConfigSource_DELTA_GRPC {
			l.add(problem.Key(p, "api_type"), "is %s; Narwhal's ADS server speaks GRPC (state of the world) or DELTA_GRPC", t)
		}
		if ads.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			l.add(problem.Key(p, "transport_api_version"), "is %s; must be V3 (Envoy refuses other xDS transport versions)", ads.GetTransportApiVersion())
		}
		gs := ads.GetGrpcServices()
		if len(gs) != 1 {
			l.add(problem.Key(p, "grpc_services"), "must list exactly one gRPC service (Narwhal's ADS server), got %d", len(gs))
		}
		if len(gs) > 0 {
			l.grpcTarget(gs[0], problem.Index(problem.Key(p, "grpc_services"), 0), "listen.xds", l.listen("xds"), false)
		}
	}
	cds := dr.GetCdsConfig()
	switch {
	case cds == nil:
		l.add("dynamic_resources.cds_config", "missing: Narwhal publishes its clusters (<prefix>-prefill, -decode, -engines) over CDS; set {ads: {}, resource_api_version: V3}")
	case cds.GetAds() == nil:
		l.add("dynamic_resources.cds_config", "must be {ads: {}}: Narwhal publishes its clusters over the ADS stream")
	default:
		l.cdsADS = true
	}
	if dr.GetLdsConfig().GetAds() != nil {
		l.add("dynamic_resources.lds_config", "Narwhal's ADS serves clusters and endpoints only, no listeners: define the listeners under static_resources")
	}
}

// listen returns the Narwhal listen address for key ("extproc", "xds"), "" without a config.
func (l *linter) listen(key string) string {
	if l.cfg == nil {
		return ""
	}
	if key == "xds" {
		return l.cfg.Listen.XDS
	}
	return l.cfg.Listen.ExtProc
}

// grpcTarget checks a GrpcService: an envoy_grpc cluster that exists statically, or a
// google_grpc target at the Narwhal address. extProc records the cluster for the ext_proc
// cluster checks.
func (l *linter) grpcTarget(g *corev3.GrpcService, p, key, want string, extProc bool) {
	switch {
	case g.GetEnvoyGrpc() != nil:
		name := g.GetEnvoyGrpc().GetClusterName()
		cp := problem.Fields(p, "envoy_grpc.cluster_name")
		lc, ok := l.clusters[name]
		if !ok {
			l.add(cp, "cluster %q is not defined under static_resources.clusters (a gRPC service to Narwhal needs a static cluster)", name)
			return
		}
		if extProc {
			if _, seen := l.extProcRefs[name]; !seen {
				l.extProcRefs[name] = cp
			}
			return
		}
		l.grpcCluster(lc, key, want)
	case g.GetGoogleGrpc() != nil:
		if want != "" {
			target := strings.TrimPrefix(g.GetGoogleGrpc().GetTargetUri(), "dns:///")
			h, port, err := net.SplitHostPort(target)
			if err != nil {
				l.add(problem.Fields(p, "google_grpc.target_uri"), "must be host:port of %s (%s), got %q", key, want, target)
				return
			}
			if msg := addrMismatch(h, port, key, want); msg != "" {
				l.add(problem.Fields(p, "google_grpc.target_uri"), "%s", msg)
			}
		}
	}
}

// grpcCluster checks a static cluster that carries gRPC to Narwhal: HTTP/2, one endpoint, at
// the address Narwhal listens on.
func (l *linter) grpcCluster(lc lintCluster, key, want string) {
	c, p := lc.c, lc.path
	if !speaksHTTP2(c) {
		l.add(problem.Key(problem.Key(p, "typed_extension_protocol_options"), httpOptionsKey),
			"cluster %q carries gRPC to Narwhal and must speak HTTP/2: set typed_extension_protocol_options[%q] {\"@type\": type.googleapis.com/%s, explicit_http_config: {http2_protocol_options: {}}}",
			c.GetName(), httpOptionsKey, httpOptionsKey)
	}
	type ep struct {
		sa   *corev3.SocketAddress
		path string
	}
	var eps []ep
	ap := problem.Fields(p, "load_assignment.endpoints")
	for i, le := range c.GetLoadAssignment().GetEndpoints() {
		for j, lb := range le.GetLbEndpoints() {
			eps = append(eps, ep{lb.GetEndpoint().GetAddress().GetSocketAddress(),
				problem.Fields(problem.Index(problem.Key(problem.Index(ap, i), "lb_endpoints"), j), "endpoint.address.socket_address")})
		}
	}
	l.transport(lc, key)
	switch {
	case len(eps) == 0:
		l.add(problem.Key(p, "load_assignment"), "cluster %q has no endpoint: it needs Narwhal's %s", c.GetName(), key)
		return
	case len(eps) > 1 && key == "listen.extproc" && !grpcHealthChecked(c):
		// Several replicas (docs/ha.md): the router's state lives in the leader alone.
		l.add(problem.Key(p, "health_checks"), "cluster %q has %d endpoints (Narwhal replicas) but no gRPC health check: Envoy would send streams to standbys too; add health_checks [{grpc_health_check: {}, ...}] (standbys answer NOT_SERVING, the leader SERVING)", c.GetName(), len(eps))
	}
	for _, e := range eps {
		if e.sa == nil {
			l.add(e.path, "must be a socket address (Narwhal's %s)", key)
			continue
		}
		if want == "" {
			continue
		}
		if msg := addrMismatch(e.sa.GetAddress(), strconv.Itoa(int(e.sa.GetPortValue())), key, want); msg != "" {
			l.add(e.path, "%s", msg)
		}
	}
}

// tlsContextType is the type of the TLS transport socket's config.
const (
	tlsContextType = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
	rawBufferType  = "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
)

// transport checks that a cluster to Narwhal's listener key (listen.extproc, listen.xds) speaks
// what the listener serves: TLS on one side only is an error naming both; with TLS, Envoy must
// check Narwhal's certificate and offer h2 by ALPN (grpc-go refuses a TLS connection without
// it), and present a client certificate where Narwhal requires one.
func (l *linter) transport(lc lintCluster, key string) {
	if l.cfg == nil {
		return
	}
	c, p := lc.c, problem.Key(lc.path, "transport_socket")
	t, tkey := l.cfg.TLS.ExtProc, "tls.extproc"
	if key == "listen.xds" {
		t, tkey = l.cfg.TLS.XDS, "tls.xds"
	}
	ts := c.GetTransportSocket()
	var up tlsv3.UpstreamTlsContext
	plain := ts == nil || typeName(ts.GetTypedConfig()) == rawBufferType ||
		ts.GetTypedConfig() == nil && ts.GetName() == "envoy.transport_sockets.raw_buffer"
	isTLS := !plain && ts.GetTypedConfig() != nil && typeName(ts.GetTypedConfig()) == tlsContextType && ts.GetTypedConfig().UnmarshalTo(&up) == nil
	switch {
	case len(c.GetTransportSocketMatches()) > 0:
		l.add(problem.Key(lc.path, "transport_socket_matches"), "cluster %q chooses its transport per endpoint, but Narwhal's %s speaks one (%s): use one transport_socket", c.GetName(), key, tkey)
		return
	case t.Enabled() && plain:
		l.add(p, "cluster %q speaks plaintext but Narwhal serves TLS on %s (%s.cert_file): add a transport_socket envoy.transport_sockets.tls with an UpstreamTlsContext (narwhal envoy-config --tls-ca writes it)", c.GetName(), key, tkey)
		return
	case t.Enabled() && !isTLS:
		l.add(p, "cluster %q's transport_socket is not an UpstreamTlsContext (%s): Narwhal serves TLS on %s (%s.cert_file); use envoy.transport_sockets.tls with an UpstreamTlsContext", c.GetName(), typeName(ts.GetTypedConfig()), key, tkey)
		return
	case !t.Enabled() && !plain:
		l.add(p, "cluster %q speaks TLS but Narwhal's %s is plaintext (no %s.cert_file): remove the transport_socket or set %s", c.GetName(), key, tkey, tkey)
		return
	case !t.Enabled():
		return
	}
	ctx, cp := up.GetCommonTlsContext(), problem.Fields(p, "typed_config.common_tls_context")
	if !slices.Contains(ctx.GetAlpnProtocols(), "h2") {
		l.add(problem.Key(cp, "alpn_protocols"), "must offer h2: Narwhal's gRPC server (grpc-go) refuses TLS connections that do not negotiate h2 by ALPN")
	}
	vc := ctx.GetValidationContext()
	switch {
	case vc.GetTrustedCa() == nil && ctx.GetValidationContextSdsSecretConfig() == nil && ctx.GetCombinedValidationContext() == nil:
		l.add(problem.Key(cp, "validation_context"), "missing: Envoy would accept any certificate for Narwhal's %s; set trusted_ca {filename: <the CA that signed %s.cert_file>}", key, tkey)
	case vc != nil && len(vc.GetMatchTypedSubjectAltNames()) == 0:
		l.add(problem.Fields(cp, "validation_context.match_typed_subject_alt_names"), "missing: Envoy would take any certificate its CA signed for Narwhal's %s; match the name Envoy dials (narwhal envoy-config writes it)", key)
	}
	if t.Mutual() && len(ctx.GetTlsCertificates()) == 0 && len(ctx.GetTlsCertificateSdsSecretConfigs()) == 0 && ctx.GetTlsCertificateProviderInstance() == nil {
		l.add(problem.Key(cp, "tls_certificates"), "missing: Narwhal requires a client certificate on %s (%s.client_ca_file); give Envoy one that CA signed", key, tkey)
	}
}

// grpcHealthChecked reports whether the cluster has an active gRPC health check.
// endpoints counts a cluster's inline endpoints.
func endpoints(c *clusterv3.Cluster) (n int) {
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		n += len(le.GetLbEndpoints())
	}
	return n
}

func grpcHealthChecked(c *clusterv3.Cluster) bool {
	for _, hc := range c.GetHealthChecks() {
		if hc.GetGrpcHealthCheck() != nil {
			return true
		}
	}
	return false
}

// addrMismatch compares the address Envoy connects to with the one Narwhal listens on: the
// ports must be equal; when Narwhal listens on one interface the host must be that one
// (loopback: any loopback address or localhost); when it listens on every interface any host
// that reaches it will do (a container name such as "narwhal" in docker compose).
func addrMismatch(host, port, key, want string) string {
	wh, wp, err := net.SplitHostPort(want)
	if err != nil {
		return ""
	}
	got := net.JoinHostPort(host, port)
	if port != wp {
		return fmt.Sprintf("Envoy connects to %s but %s is %s: the ports differ", got, key, want)
	}
	wa, werr := netip.ParseAddr(wh)
	switch {
	case wh == "" || werr == nil && wa.IsUnspecified():
		return "" // every interface
	case isLoopback(wh):
		if !isLoopback(host) {
			return fmt.Sprintf("Envoy connects to %s but %s is %s, a loopback address: Envoy must run on Narwhal's host and connect to %s (or have Narwhal listen on 0.0.0.0)", got, key, want, want)
		}
	case werr == nil:
		if ha, err := netip.ParseAddr(host); err == nil && ha.Unmap() != wa.Unmap() {
			return fmt.Sprintf("Envoy connects to %s but %s is %s", got, key, want)
		}
	}
	return ""
}

func isLoopback(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsLoopback()
}

func speaksHTTP2(c *clusterv3.Cluster) bool {
	if a, ok := c.GetTypedExtensionProtocolOptions()[httpOptionsKey]; ok {
		var o upstreamhttpv3.HttpProtocolOptions
		if a.UnmarshalTo(&o) == nil && o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
			return true
		}
	}
	// The deprecated Cluster.http2_protocol_options, read by name.
	fd := c.ProtoReflect().Descriptor().Fields().ByName("http2_protocol_options")
	return fd != nil && c.ProtoReflect().Has(fd)
}

// extProcClusters checks every cluster an ext_proc filter (or override) sends to.
func (l *linter) extProcClusters() {
	names := make([]string, 0, len(l.extProcRefs))
	for n := range l.extProcRefs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		lc := l.clusters[n]
		l.grpcCluster(lc, "listen.extproc", l.listen("extproc"))
		if l.cfg != nil {
			need := l.cfg.Router.WaitingSet.Capacity + fleetStreams(l.cfg)
			l.breakers(lc, need, fmt.Sprintf("router.waiting_set.capacity plus the fleet's in-flight streams (%d + %d: every waiting or in-flight request holds an ext_proc stream)",
				l.cfg.Router.WaitingSet.Capacity, fleetStreams(l.cfg)), "max_requests", "max_pending_requests")
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Listeners, HTTP connection managers, routes

func (l *linter) listener(ln *listenerv3.Listener, p string) {
	limit := uint64(envoyDefaultBufferLimit)
	limitPath := problem.Key(p, "per_connection_buffer_limit_bytes")
	if v := ln.GetPerConnectionBufferLimitBytes(); v != nil {
		limit = uint64(v.GetValue())
	}
	chains := ln.GetFilterChains()
	paths := make([]string, len(chains))
	for i := range chains {
		paths[i] = problem.Index(problem.Key(p, "filter_chains"), i)
	}
	if dc := ln.GetDefaultFilterChain(); dc != nil {
		chains = append(chains, dc)
		paths = append(paths, problem.Key(p, "default_filter_chain"))
	}
	for i, fc := range chains {
		for j, f := range fc.GetFilters() {
			a := f.GetTypedConfig()
			if a == nil || typeName(a) != hcmFilterType {
				continue
			}
			var hcm hcmv3.HttpConnectionManager
			if a.UnmarshalTo(&hcm) != nil {
				continue
			}
			l.hcm(&hcm, problem.Key(problem.Index(problem.Key(paths[i], "filters"), j), "typed_config"), limit, limitPath, ln.GetPerConnectionBufferLimitBytes() != nil)
		}
	}
}

func typeName(a *anypb.Any) string {
	u := a.GetTypeUrl()
	return u[strings.LastIndexByte(u, '/')+1:]
}

// extProcFilter is one ext_proc filter of an HTTP connection manager.
type extProcFilter struct {
	name     string // the HttpFilter name, the key of per-route configs
	cfg      *extprocv3.ExternalProcessor
	path     string // of its typed_config
	disabled bool   // disabled by default (HttpFilter.disabled)
}

// hcmCtx is what the route rules of one connection manager need.
type hcmCtx struct {
	extProcs   []extProcFilter
	limit      uint64 // listener per_connection_buffer_limit_bytes
	limitPath  string
	limitSet   bool
	rc         *routev3.RouteConfiguration
	rcPath     string
	cdsRefPath string // first route cluster that comes from CDS
}

func (l *linter) hcm(h *hcmv3.HttpConnectionManager, p string, limit uint64, limitPath string, limitSet bool) {
	ctx := &hcmCtx{limit: limit, limitPath: limitPath, limitSet: limitSet}
	filters := h.GetHttpFilters()
	router := -1
	for i, f := range filters {
		fp := problem.Index(problem.Key(p, "http_filters"), i)
		switch typeName(f.GetTypedConfig()) {
		case routerFilterType:
			router = i
		case extProcFilterType:
			l.sawExtProc = true
			var ep extprocv3.ExternalProcessor
			if f.GetTypedConfig().UnmarshalTo(&ep) != nil {
				continue
			}
			if router >= 0 {
				l.add(fp, "the ext_proc filter comes after the router filter (http_filters[%d]), so it never runs: put it before", router)
			}
			ef := extProcFilter{name: f.GetName(), cfg: &ep, path: problem.Key(fp, "typed_config"), disabled: f.GetDisabled()}
			ctx.extProcs = append(ctx.extProcs, ef)
			l.extProc(ef)
		}
	}
	if router < 0 {
		l.add(problem.Key(p, "http_filters"), "no router filter (%s): it must be the last HTTP filter", routerFilterType)
	} else if router != len(filters)-1 {
		l.add(problem.Index(problem.Key(p, "http_filters"), router), "the router filter must be the last HTTP filter")
	}
	if l.cfg != nil {
		maxWait := seconds(l.cfg.Router.WaitingSet.MaxWaitS)
		idle := envoyDefaultStreamIdle
		if d := h.GetStreamIdleTimeout(); d != nil {
			idle = d.AsDuration()
		}
		if idle != 0 && idle <= maxWait {
			l.add(problem.Key(p, "stream_idle_timeout"), "is %s%s, not above router.waiting_set.max_wait_s (%s): a request waiting in Narwhal's waiting set sends nothing, and Envoy would end it with 408; raise it (or 0 to disable)",
				fmtDuration(idle), defaultNote(h.GetStreamIdleTimeout() == nil), fmtDuration(maxWait))
		}
		if d := h.GetRequestTimeout(); d != nil && d.AsDuration() != 0 && d.AsDuration() <= maxWait {
			l.add(problem.Key(p, "request_timeout"), "is %s, not above router.waiting_set.max_wait_s (%s): it covers the time a request waits in Narwhal's waiting set", fmtDuration(d.AsDuration()), fmtDuration(maxWait))
		}
	}
	switch {
	case h.GetRouteConfig() != nil:
		ctx.rc, ctx.rcPath = h.GetRouteConfig(), problem.Key(p, "route_config")
		l.routes(ctx)
	case h.GetRds() != nil:
		msg := "routes from RDS cannot be checked; Narwhal's ADS serves no routes: inline the route_config"
		if h.GetRds().GetConfigSource().GetAds() != nil {
			msg = "takes routes from ADS, but Narwhal's ADS serves clusters and endpoints only: inline the route_config"
		}
		l.add(problem.Key(p, "rds"), "%s", msg)
	default:
		l.add(p, "routes must be an inline route_config (scoped routes cannot be checked)")
	}
}

// extProc checks the settings of one ext_proc filter.
func (l *linter) extProc(f extProcFilter) {
	ep, p := f.cfg, f.path
	switch {
	case ep.GetGrpcService() != nil:
		g := ep.GetGrpcService()
		l.grpcTarget(g, problem.Key(p, "grpc_service"), "listen.extproc", l.listen("extproc"), true)
		if lc, ok := l.clusters[g.GetEnvoyGrpc().GetClusterName()]; ok && endpoints(lc.c) > 1 &&
			!slices.Contains(strings.Split(g.GetRetryPolicy().GetRetryOn(), ","), "connect-failure") {
			// Several replicas (docs/ha.md): a killed leader refuses connections until the health
			// check sees it.
			l.add(problem.Fields(p, "grpc_service.retry_policy"), "cluster %q has %d endpoints (Narwhal replicas): set a retry_policy with retry_on connect-failure (and previous_hosts as its retry_host_predicate), so that a stream a killed leader cannot take opens on another replica",
				g.GetEnvoyGrpc().GetClusterName(), endpoints(lc.c))
		}
	case ep.GetHttpService() != nil:
		l.add(problem.Key(p, "http_service"), "Narwhal speaks the gRPC ext_proc protocol only (and http_service cannot send bodies): use grpc_service {envoy_grpc: {cluster_name: %s}}", ExtProcCluster)
	default:
		l.add(problem.Key(p, "grpc_service"), "missing: set {envoy_grpc: {cluster_name: %s}}", ExtProcCluster)
	}
	fullDuplex := l.processingMode(ep.GetProcessingMode(), problem.Key(p, "processing_mode"), ep.GetFailureModeAllow(), problem.Key(p, "failure_mode_allow"))
	if ep.GetFailureModeAllow() && !fullDuplex {
		l.add(problem.Key(p, "failure_mode_allow"), "must be false: fail-open forwards a request Narwhal did not process when Narwhal is unreachable or slow, and the ORIGINAL_DST route then takes the client's own %s", wire.HeaderDestination)
	}
	if l.cfg != nil && !fullDuplex {
		maxWait := seconds(l.cfg.Router.WaitingSet.MaxWaitS)
		mt, def := envoyDefaultMessageTimeout, true
		if d := ep.GetMessageTimeout(); d != nil {
			mt, def = d.AsDuration(), false
		}
		if mt <= maxWait {
			l.add(problem.Key(p, "message_timeout"), "is %s%s, not above router.waiting_set.max_wait_s (%s): a request Narwhal holds in its waiting set holds the body reply, and Envoy would answer 504 first; set it to e.g. %s",
				fmtDuration(mt), defaultNote(def), fmtDuration(maxWait), fmtDuration(maxWait+5*time.Second))
		}
	}
	if !ep.GetAllowModeOverride() {
		l.add(problem.Key(p, "allow_mode_override"), "must be true: Narwhal skips the bodies of responses that are not a streamed success with mode_override, which Envoy ignores otherwise")
	}
	l.metadataOptions(ep.GetMetadataOptions(), problem.Key(p, "metadata_options"))
	if ep.GetObservabilityMode() {
		l.add(problem.Key(p, "observability_mode"), "must be false: in observability mode Envoy ignores Narwhal's replies, so nothing is placed")
	}
	if ep.GetDisableImmediateResponse() {
		l.add(problem.Key(p, "disable_immediate_response"), "must be false: Narwhal answers rejections (400, 413, 429, 503, 504) with an immediate response")
	}
	if mr := ep.GetMutationRules(); mr != nil {
		mp := problem.Key(p, "mutation_rules")
		if mr.GetDisallowAll().GetValue() {
			l.add(problem.Key(mp, "disallow_all"), "must not be true: Narwhal sets %s", strings.Join(wire.Headers, ", "))
		}
		if re := mr.GetDisallowExpression().GetRegex(); re != "" {
			if rx, err := regexp.Compile("^(?:" + re + ")$"); err == nil {
				for _, h := range wire.Headers {
					if rx.MatchString(h) {
						l.add(problem.Key(mp, "disallow_expression"), "matches %s, a header Narwhal sets: Envoy would drop it", h)
						break
					}
				}
			}
		}
	}
}

func defaultNote(def bool) string {
	if def {
		return " (the default)"
	}
	return ""
}

func (l *linter) metadataOptions(mo *extprocv3.MetadataOptions, p string) {
	if !slices.Contains(mo.GetReceivingNamespaces().GetUntyped(), wire.LBNamespace) {
		l.add(problem.Fields(p, "receiving_namespaces.untyped"), "must include %q: Envoy applies only the dynamic metadata namespaces listed, and Narwhal sends the destination under %q", wire.LBNamespace, wire.LBNamespace)
	}
}

// processingMode checks a processing mode and reports whether the request body is full duplex.
func (l *linter) processingMode(pm *extprocv3.ProcessingMode, p string, failOpen bool, failOpenPath string) (fullDuplex bool) {
	if pm.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP {
		l.add(problem.Key(p, "request_header_mode"), "must be SEND: Narwhal reads the path and removes client routing headers at the request headers")
	}
	rb := problem.Key(p, "request_body_mode")
	switch pm.GetRequestBodyMode() {
	case extprocv3.ProcessingMode_BUFFERED:
	case extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		fullDuplex = true
		if pm.GetRequestTrailerMode() != extprocv3.ProcessingMode_SEND {
			l.add(problem.Key(p, "request_trailer_mode"), "must be SEND with request_body_mode FULL_DUPLEX_STREAMED (Envoy refuses the config otherwise; the trailers tell Narwhal the body ended)")
		}
		if failOpen {
			l.add(failOpenPath, "must be false with request_body_mode FULL_DUPLEX_STREAMED (Envoy refuses the combination), and fail-open would forward unplaced requests to the ORIGINAL_DST route")
		}
	case extprocv3.ProcessingMode_STREAMED:
		l.add(rb, "STREAMED cannot carry a body-based placement: Envoy sends the headers upstream as soon as the headers reply is given, and Narwhal answers such requests 500 unsupported_body_mode; use BUFFERED or FULL_DUPLEX_STREAMED")
	case extprocv3.ProcessingMode_NONE:
		l.add(rb, "is NONE (the default): Narwhal places a request by its body (model, prompt, max_tokens); set BUFFERED or FULL_DUPLEX_STREAMED")
	case extprocv3.ProcessingMode_BUFFERED_PARTIAL:
		l.add(rb, "BUFFERED_PARTIAL may send Narwhal a truncated body: use BUFFERED (Narwhal answers oversized bodies 413 itself) or FULL_DUPLEX_STREAMED")
	default:
		l.add(rb, "is %s: use BUFFERED or FULL_DUPLEX_STREAMED", pm.GetRequestBodyMode())
	}
	if pm.GetResponseHeaderMode() == extprocv3.ProcessingMode_SKIP {
		l.add(problem.Key(p, "response_header_mode"), "must be SEND: Narwhal reads the response status and content type to account each request")
	}
	rs := problem.Key(p, "response_body_mode")
	switch pm.GetResponseBodyMode() {
	case extprocv3.ProcessingMode_STREAMED:
	case extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if pm.GetResponseTrailerMode() != extprocv3.ProcessingMode_SEND {
			l.add(problem.Key(p, "response_trailer_mode"), "must be SEND with response_body_mode FULL_DUPLEX_STREAMED (Envoy refuses the config otherwise)")
		}
	case extprocv3.ProcessingMode_NONE:
		l.add(rs, "is NONE: Narwhal observes the streamed response (first token, tokens, usage, end) to account each request; set STREAMED")
	case extprocv3.ProcessingMode_BUFFERED, extprocv3.ProcessingMode_BUFFERED_PARTIAL:
		l.add(rs, "%s holds the whole response until it ends: Narwhal would see the first token only at the end, and long streams would overflow the buffer; set STREAMED", pm.GetResponseBodyMode())
	default:
		l.add(rs, "is %s: set STREAMED", pm.GetResponseBodyMode())
	}
	return fullDuplex
}

// routes checks every route of a connection manager's route_config.
func (l *linter) routes(ctx *hcmCtx) {
	for i, vh := range ctx.rc.GetVirtualHosts() {
		vp := problem.Index(problem.Key(ctx.rcPath, "virtual_hosts"), i)
		for j, r := range vh.GetRoutes() {
			l.route(ctx, vh, r, problem.Index(problem.Key(vp, "routes"), j))
		}
		if l.cfg != nil && len(l.originalDst) > 0 {
			l.routerPaths(ctx, vh, vp)
		}
	}
	if ctx.cdsRefPath != "" && (ctx.rc.GetValidateClusters() == nil || ctx.rc.GetValidateClusters().GetValue()) {
		l.add(problem.Key(ctx.rcPath, "validate_clusters"), "must be false: a route names a cluster that comes from CDS (%s), and a static route_config checks its clusters when it loads, before CDS delivers them", ctx.cdsRefPath)
	}
}

// routeTargets lists the clusters a route action names, with their paths.
func routeTargets(ra *routev3.RouteAction, rp string) (names, paths []string) {
	if c := ra.GetCluster(); c != "" {
		names, paths = append(names, c), append(paths, problem.Fields(rp, "route.cluster"))
	}
	for k, wc := range ra.GetWeightedClusters().GetClusters() {
		names = append(names, wc.GetName())
		paths = append(paths, problem.Key(problem.Index(problem.Fields(rp, "route.weighted_clusters.clusters"), k), "name"))
	}
	return names, paths
}

func (l *linter) route(ctx *hcmCtx, vh *routev3.VirtualHost, r *routev3.Route, rp string) {
	ra := r.GetRoute()
	if ra == nil {
		return // a redirect or direct response
	}
	names, paths := routeTargets(ra, rp)
	for k, m := range ra.GetRequestMirrorPolicies() {
		names = append(names, m.GetCluster())
		paths = append(paths, problem.Key(problem.Index(problem.Fields(rp, "route.request_mirror_policies"), k), "cluster"))
	}
	for k, name := range names {
		if _, ok := l.clusters[name]; ok {
			continue
		}
		if l.fromCDS(name) {
			if ctx.cdsRefPath == "" {
				ctx.cdsRefPath = paths[k]
			}
			continue
		}
		msg := fmt.Sprintf("cluster %q is not defined under static_resources.clusters", name)
		if ns := l.narwhalClusters(); ns != nil && l.cdsADS {
			msg += ", and Narwhal's ADS publishes only " + strings.Join(ns, ", ")
		}
		l.add(paths[k], "%s", msg)
	}
	if ra.GetClusterHeader() != "" && len(l.originalDst) > 0 {
		l.add(problem.Fields(rp, "route.cluster_header"), "lets the request header %q choose the cluster, so a client could choose %s (ORIGINAL_DST) and its own destination: name the cluster", ra.GetClusterHeader(), l.originalDst[0])
	}
	l.metadataMatch(ra.GetMetadataMatch(), problem.Fields(rp, "route.metadata_match"))
	for k, wc := range ra.GetWeightedClusters().GetClusters() {
		l.metadataMatch(wc.GetMetadataMatch(), problem.Key(problem.Index(problem.Fields(rp, "route.weighted_clusters.clusters"), k), "metadata_match"))
	}
	odst := false
	for _, n := range names[:len(names)-len(ra.GetRequestMirrorPolicies())] {
		odst = odst || l.isOriginalDst(n)
	}
	for k, m := range ra.GetRequestMirrorPolicies() {
		if l.isOriginalDst(m.GetCluster()) {
			l.add(problem.Key(problem.Index(problem.Fields(rp, "route.request_mirror_policies"), k), "cluster"), "mirrors to an ORIGINAL_DST cluster: the mirrored copy goes wherever its destination header says")
		}
	}
	if odst {
		l.originalDstRoute(ctx, vh, r, rp)
	}
}

func (l *linter) metadataMatch(md *corev3.Metadata, p string) {
	for _, ns := range sortedMapKeys(md.GetFilterMetadata()) {
		np := problem.Key(problem.Key(p, "filter_metadata"), ns)
		if ns != wire.LBNamespace {
			l.add(np, "subset load balancing matches only filter_metadata[%q] of endpoints, where Narwhal publishes %q; %q is never matched", wire.LBNamespace, wire.LBRoleKey, ns)
			continue
		}
		for k, v := range sortedStruct(md.GetFilterMetadata()[ns]) {
			kp := problem.Key(np, k)
			if k != wire.LBRoleKey {
				l.add(kp, "Narwhal publishes only %q under filter_metadata[%q]: a subset on %q matches no endpoint", wire.LBRoleKey, wire.LBNamespace, k)
				continue
			}
			if s := v.GetStringValue(); s != config.RolePrefill && s != config.RoleDecode {
				l.add(kp, "must be %q or %q, got %v", config.RolePrefill, config.RoleDecode, v.AsInterface())
			}
		}
	}
}

// extProcFor reports whether an ext_proc filter processes a route, where the route-level
// setting that decides it is, and the per-route overrides (nil if none).
func extProcFor(ctx *hcmCtx, f extProcFilter, vh *routev3.VirtualHost, r *routev3.Route, rp, vp string) (enabled bool, where string, ov *extprocv3.ExtProcOverrides, ovPath string) {
	type level struct {
		m map[string]*anypb.Any
		p string
	}
	for _, lv := range []level{
		{r.GetTypedPerFilterConfig(), problem.Key(rp, "typed_per_filter_config")},
		{vh.GetTypedPerFilterConfig(), problem.Key(vp, "typed_per_filter_config")},
		{ctx.rc.GetTypedPerFilterConfig(), problem.Key(ctx.rcPath, "typed_per_filter_config")},
	} {
		a, ok := lv.m[f.name]
		if !ok {
			continue
		}
		p := problem.Key(lv.p, f.name)
		if typeName(a) == "envoy.config.route.v3.FilterConfig" {
			var fc routev3.FilterConfig
			if a.UnmarshalTo(&fc) != nil {
				return !f.disabled, "", nil, ""
			}
			if fc.GetDisabled() {
				return false, problem.Key(p, "disabled"), nil, ""
			}
			a, p = fc.GetConfig(), problem.Key(p, "config")
			if a == nil {
				return true, p, nil, ""
			}
		}
		var pr extprocv3.ExtProcPerRoute
		if typeName(a) != "envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute" || a.UnmarshalTo(&pr) != nil {
			return true, p, nil, ""
		}
		if pr.GetDisabled() {
			return false, problem.Key(p, "disabled"), nil, ""
		}
		return true, p, pr.GetOverrides(), problem.Key(p, "overrides")
	}
	if f.disabled {
		return false, problem.Key(problem.Parent(f.path), "disabled"), nil, ""
	}
	return true, "", nil, ""
}

func (l *linter) originalDstRoute(ctx *hcmCtx, vh *routev3.VirtualHost, r *routev3.Route, rp string) {
	vp := problem.Parent(problem.Parent(rp)) // .../virtual_hosts[i]
	target := problem.Key(rp, "route")
	if len(ctx.extProcs) == 0 {
		l.add(target, "sends to an ORIGINAL_DST cluster, but this connection manager has no ext_proc filter: the client's own %s would choose the upstream", wire.HeaderDestination)
	} else {
		processed := false
		var off []string
		for _, f := range ctx.extProcs {
			on, where, ov, ovp := extProcFor(ctx, f, vh, r, rp, vp)
			if !on {
				off = append(off, where)
				continue
			}
			processed = true
			if ov != nil {
				l.overrides(f, ov, ovp)
			}
		}
		if !processed {
			l.add(target, "sends to an ORIGINAL_DST cluster, but the ext_proc filter is disabled for this route (%s): the client's own %s would choose the upstream",
				strings.Join(off, ", "), wire.HeaderDestination)
		}
	}
	m := r.GetMatch()
	mp := problem.Key(rp, "match")
	switch {
	case m.GetPath() == "":
		l.add(mp, "a route to an ORIGINAL_DST cluster must match one exact path (match.path) that Narwhal places: with any other match, a request Narwhal passes through unplaced (its path is not in router.paths) would reach the ORIGINAL_DST cluster with no destination")
	case m.GetCaseSensitive() != nil && !m.GetCaseSensitive().GetValue():
		l.add(problem.Key(mp, "case_sensitive"), "must not be false on a route to an ORIGINAL_DST cluster: Narwhal places only the exact paths of router.paths")
	case l.cfg != nil && !slices.Contains(l.cfg.Router.Paths, m.GetPath()):
		l.add(problem.Key(mp, "path"), "%q is not one of router.paths (%s): Narwhal passes such requests through unplaced, and the ORIGINAL_DST cluster would have no destination", m.GetPath(), strings.Join(l.cfg.Router.Paths, ", "))
	}
	ra := r.GetRoute()
	if ra.GetTimeout() == nil {
		l.add(problem.Key(target, "timeout"), "unset, so 15s, which cuts off long streamed generations: set 0s (no timeout) or a long one")
	}
	if l.cfg == nil {
		return
	}
	maxWait := seconds(l.cfg.Router.WaitingSet.MaxWaitS)
	if d := ra.GetIdleTimeout(); d != nil && d.AsDuration() != 0 && d.AsDuration() <= maxWait {
		l.add(problem.Key(target, "idle_timeout"), "is %s, not above router.waiting_set.max_wait_s (%s): a request waiting in Narwhal's waiting set is idle", fmtDuration(d.AsDuration()), fmtDuration(maxWait))
	}
	limit, lp := ctx.limit, ctx.limitPath
	perReq := func(m proto.Message, p string) {
		if v := protoUint(m, "request_body_buffer_limit"); v != nil {
			limit, lp = *v, problem.Key(p, "request_body_buffer_limit")
		} else if v := protoUint(m, "per_request_buffer_limit_bytes"); v != nil {
			limit, lp = min(*v, ctx.limit), problem.Key(p, "per_request_buffer_limit_bytes")
		}
	}
	if protoUint(r, "request_body_buffer_limit") != nil || protoUint(r, "per_request_buffer_limit_bytes") != nil {
		perReq(r, rp)
	} else {
		perReq(vh, vp)
	}
	if want := uint64(l.cfg.Router.BodyLimitBytes); limit < want {
		l.add(lp, "the request buffer limit is %d bytes%s, below router.body_limit_bytes (%d): Envoy would answer 413 itself before Narwhal sees the body; raise it to at least %d",
			limit, defaultNote(lp == ctx.limitPath && !ctx.limitSet), want, want+1<<20)
	}
}

// overrides checks per-route ext_proc overrides of a route to an ORIGINAL_DST cluster.
func (l *linter) overrides(f extProcFilter, ov *extprocv3.ExtProcOverrides, p string) {
	failOpen := f.cfg.GetFailureModeAllow()
	if v := ov.GetFailureModeAllow(); v != nil {
		failOpen = v.GetValue()
	}
	fullDuplex := f.cfg.GetProcessingMode().GetRequestBodyMode() == extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if pm := ov.GetProcessingMode(); pm != nil {
		fullDuplex = l.processingMode(pm, problem.Key(p, "processing_mode"), failOpen, problem.Key(p, "failure_mode_allow"))
	}
	if v := ov.GetFailureModeAllow(); v.GetValue() && !fullDuplex {
		l.add(problem.Key(p, "failure_mode_allow"), "must be false: fail-open forwards a request Narwhal did not process to the ORIGINAL_DST route, with the client's own %s", wire.HeaderDestination)
	}
	if protoBool(ov, "async_mode") { // deprecated, read by name
		l.add(problem.Key(p, "async_mode"), "must be false: in async mode Envoy does not wait for Narwhal's replies, so nothing is placed")
	}
	if g := ov.GetGrpcService(); g != nil {
		l.grpcTarget(g, problem.Key(p, "grpc_service"), "listen.extproc", l.listen("extproc"), true)
	}
	if mo := ov.GetMetadataOptions(); mo != nil {
		l.metadataOptions(mo, problem.Key(p, "metadata_options"))
	}
}

// routerPaths checks that POST to each of router.paths reaches, in this virtual host, a route
// to an ORIGINAL_DST cluster that ext_proc processes.
func (l *linter) routerPaths(ctx *hcmCtx, vh *routev3.VirtualHost, vp string) {
	for _, path := range l.cfg.Router.Paths {
		found := false
		for j, r := range vh.GetRoutes() {
			match, certain := routeMatches(r.GetMatch(), path)
			if !match || !certain {
				continue
			}
			found = true
			rp := problem.Index(problem.Key(vp, "routes"), j)
			names, _ := routeTargets(r.GetRoute(), rp)
			odst := len(names) > 0
			for _, n := range names {
				odst = odst && l.isOriginalDst(n)
			}
			if !odst { // a route to ORIGINAL_DST is checked by the ORIGINAL_DST route rules
				l.add(rp, "POST %s (one of router.paths) takes this route, which does not send to the ORIGINAL_DST cluster: requests Narwhal places would not reach the engine it chose", path)
			}
			break
		}
		if !found {
			l.add(problem.Key(vp, "routes"), "no route matches POST %s (one of router.paths): add {match: {path: %s}, route: {cluster: %s, timeout: 0s}}", path, path, OriginalDstCluster)
		}
	}
}

// routeMatches reports whether a route matches a POST to path, and whether that is certain
// (false when the match depends on headers, query parameters or other request facts).
func routeMatches(m *routev3.RouteMatch, path string) (match, certain bool) {
	cs := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	eq := func(a, b string) bool { return a == b || !cs && strings.EqualFold(a, b) }
	prefix := func(s, p string) bool { return len(s) >= len(p) && eq(s[:len(p)], p) }
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix:
		match = prefix(path, ps.Prefix)
	case *routev3.RouteMatch_Path:
		match = eq(path, ps.Path)
	case *routev3.RouteMatch_PathSeparatedPrefix:
		match = eq(path, ps.PathSeparatedPrefix) || prefix(path, ps.PathSeparatedPrefix+"/")
	case *routev3.RouteMatch_SafeRegex:
		rx, err := regexp.Compile("^(?:" + ps.SafeRegex.GetRegex() + ")$")
		if err != nil {
			return false, false
		}
		match = rx.MatchString(path)
	default:
		return false, false
	}
	if !match {
		return false, true
	}
	certain = m.GetRuntimeFraction() == nil && len(m.GetQueryParameters()) == 0 && m.GetGrpc() == nil &&
		m.GetTlsContext() == nil && len(m.GetDynamicMetadata()) == 0 && len(m.GetCookies()) == 0 && m.GetFilterState() == nil
	for _, h := range m.GetHeaders() {
		if h.GetName() != ":method" {
			certain = false
			continue
		}
		ok, known := methodMatches(h, "POST")
		if !known {
			certain = false
		} else if !ok {
			return false, true
		}
	}
	return true, certain
}

// methodMatches evaluates a :method header matcher against a method, when it can.
func methodMatches(h *routev3.HeaderMatcher, method string) (ok, known bool) {
	var sm *matcherv3.StringMatcher
	switch {
	case h.GetStringMatch() != nil:
		sm = h.GetStringMatch()
	case h.GetPresentMatch():
		return !h.GetInvertMatch(), true
	default:
		// The deprecated exact_match, read by name.
		fd := h.ProtoReflect().Descriptor().Fields().ByName("exact_match")
		if fd == nil || !h.ProtoReflect().Has(fd) {
			return false, false
		}
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: h.ProtoReflect().Get(fd).String()}}
	}
	cmp := func(a, b string) bool { return a == b || sm.GetIgnoreCase() && strings.EqualFold(a, b) }
	switch p := sm.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		ok = cmp(method, p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		ok = len(method) >= len(p.Prefix) && cmp(method[:len(p.Prefix)], p.Prefix)
	default:
		return false, false
	}
	return ok != h.GetInvertMatch(), true
}

// ---------------------------------------------------------------------------------------------
// Helpers

// protoUint reads an optional UInt32Value or UInt64Value field by name (nil when unset), so that
// deprecated fields need no deprecated getter.
func protoUint(m proto.Message, name string) *uint64 {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil || !r.Has(fd) {
		return nil
	}
	var v uint64
	switch w := r.Get(fd).Message().Interface().(type) {
	case *wrapperspb.UInt32Value:
		v = uint64(w.GetValue())
	case *wrapperspb.UInt64Value:
		v = w.GetValue()
	default:
		return nil
	}
	return &v
}

// protoBool reads a bool field by name, so that deprecated fields need no deprecated getter.
func protoBool(m proto.Message, name string) bool {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(protoreflect.Name(name))
	return fd != nil && fd.Kind() == protoreflect.BoolKind && r.Get(fd).Bool()
}

func sortedMapKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// sortedStruct iterates a Struct's fields in key order.
func sortedStruct(s *structpb.Struct) func(func(string, *structpb.Value) bool) {
	return func(yield func(string, *structpb.Value) bool) {
		for _, k := range sortedMapKeys(s.GetFields()) {
			if !yield(k, s.GetFields()[k]) {
				return
			}
		}
	}
}

func seconds(s float64) time.Duration { return config.Seconds(s) }

// fmtDuration writes a duration the way Envoy's YAML does: seconds with an "s" suffix.
func fmtDuration(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}
