package bootstrap

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/wire"
)

// Request body modes of the ext_proc filter that can carry a body-based placement.
const (
	BodyBuffered   = "BUFFERED"
	BodyFullDuplex = "FULL_DUPLEX_STREAMED"
)

// Defaults of Options.
const (
	DefaultEnvoyListen = "0.0.0.0:10000"
	DefaultEnvoyAdmin  = "127.0.0.1:9901"
	DefaultNodeID      = "narwhal-envoy"
)

// Options are the choices of a generated bootstrap that the Narwhal config does not
// make. The zero value is the default deployment: Envoy on the same host as Narwhal.
type Options struct {
	// Listen is the address of Envoy's HTTP listener (host:port); "" means 0.0.0.0:10000.
	Listen string
	// Admin is the address of Envoy's admin interface (host:port); "" means 127.0.0.1:9901.
	Admin string
	// BodyMode is the ext_proc request_body_mode: BodyBuffered ("" means it) or BodyFullDuplex.
	BodyMode string
	// NarwhalHosts, when set, replace the host of listen.extproc and listen.xds in the addresses
	// Envoy connects to, keeping their ports: the names Envoy reaches Narwhal by, such as
	// "narwhal", the service name in docker compose; several for replicas on etcd (docs/ha.md:
	// the ext_proc cluster's gRPC health check then sends streams to the leader only, and every
	// replica serves ADS). Without it, a host that means every interface (empty, 0.0.0.0, ::)
	// becomes 127.0.0.1 (or ::1).
	NarwhalHosts []string
	// NodeID and NodeCluster identify this Envoy to Narwhal's ADS server; "" means
	// "narwhal-envoy".
	NodeID, NodeCluster string
	// DiscoveredEngines is how many engines discovery (docs/discovery.md) may add beyond the
	// config's: the circuit breakers are sized for them too, each at the largest max_streams and
	// prefill_concurrency of the config's profiles. 0 with a config that discovers engines means
	// DefaultDiscoveredEngines.
	DiscoveredEngines int
	// TLS is Envoy's side of Narwhal's TLS (tls.extproc, tls.xds; docs/security.md): the files
	// as Envoy reads them. Needed when either listener serves TLS; its client certificate when
	// either requires one (client_ca_file).
	TLS ClientTLS
}

// ClientTLS names the files of a TLS client: the CA that signed the server's certificate and,
// for mutual TLS, the client's certificate and key.
type ClientTLS struct {
	CAFile, CertFile, KeyFile string
}

// bsTLS is the transport socket of one cluster to Narwhal.
type bsTLS struct {
	ClientTLS
	Mutual bool
	SANs   []bsSAN // the names Narwhal's certificate must carry: the hosts Envoy dials
}

type bsSAN struct{ Type, Value string }

// DefaultDiscoveredEngines is Options.DiscoveredEngines for a config that discovers engines.
const DefaultDiscoveredEngines = 64

// Bootstrap returns a complete Envoy v3 bootstrap (YAML, commented) for a Narwhal config: an
// HTTP listener whose routes send each of router.paths (exact path, POST), after Narwhal's
// ext_proc filter has placed it, to the ORIGINAL_DST cluster narwhal-original-dst that reads
// x-gateway-destination-endpoint; every other request to the decode engines (cluster
// <prefix>-engines from Narwhal's CDS, subset role=decode) with ext_proc disabled on that route
// and the client routing headers removed; the static clusters narwhal-extproc (HTTP/2, raised
// circuit breakers, gRPC health check) and narwhal-xds (HTTP/2); and dynamic_resources with
// ADS on narwhal-xds and CDS over ADS. The output is deterministic and passes
// Validate(out, cfg) with no problem.
func Generate(cfg *config.Config, o Options) ([]byte, error) {
	if cfg == nil {
		return nil, errors.New("envoy: Bootstrap needs a Narwhal config")
	}
	d, err := bootstrapData(cfg, o)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := bootstrapTemplate.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("envoy: bootstrap template: %w", err)
	}
	return buf.Bytes(), nil
}

// bsAddr is a socket address as the template writes it.
type bsAddr struct {
	Host string
	Port int
}

func (a bsAddr) String() string { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// bsAddrs are the endpoints of one cluster.
type bsAddrs []bsAddr

// IsIP reports whether every host is an IP address (a STATIC cluster).
func (as bsAddrs) IsIP() bool {
	for _, a := range as {
		if !a.IsIP() {
			return false
		}
	}
	return true
}

func (as bsAddrs) String() string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// IsIP reports whether the host is an IP address (a STATIC cluster) rather than a name
// (STRICT_DNS).
func (a bsAddr) IsIP() bool {
	_, err := netip.ParseAddr(a.Host)
	return err == nil
}

type bsRoute struct {
	Path string
}

type bsData struct {
	NodeID, NodeCluster string
	Listen, Admin       bsAddr
	AdminURL            string // host:port of the admin as a browser would reach it
	ExtProc, XDS        bsAddrs
	ExtProcTLS, XDSTLS  *bsTLS // nil: plaintext
	ExtProcListen       string
	XDSListen           string
	FullDuplex          bool
	BodyMode            string
	Paths               []bsRoute
	BodyLimit           int64
	BufferLimit         int64
	MaxWait             string
	MessageTimeout      string
	StreamIdle          string
	Capacity            int
	Streams             int
	Discovered          int // engines discovery may add, counted in Streams
	ExtProcBreaker      int
	OriginalDstBreaker  int
	Prefix              string
	Engines             string // <prefix>-engines
	Clusters            []string
	OriginalDst         string
	ExtProcCluster      string
	XDSCluster          string
	Headers             []string // client routing headers removed on the pass-through route
	HeaderDestination   string
	LBNamespace         string
	RoleDecode          string
}

func bootstrapData(cfg *config.Config, o Options) (*bsData, error) {
	names := wire.Names(cfg.XDS.ClusterPrefix)
	d := &bsData{
		NodeID: o.NodeID, NodeCluster: o.NodeCluster,
		BodyLimit: cfg.Router.BodyLimitBytes, Capacity: cfg.Router.WaitingSet.Capacity,
		Prefix: cfg.XDS.ClusterPrefix, Engines: names.Engines,
		OriginalDst: OriginalDstCluster, ExtProcCluster: ExtProcCluster, XDSCluster: XDSCluster,
		ExtProcListen: cfg.Listen.ExtProc, XDSListen: cfg.Listen.XDS,
		HeaderDestination: wire.HeaderDestination, LBNamespace: wire.LBNamespace, RoleDecode: config.RoleDecode,
		Headers: wire.Headers,
	}
	all := names.List()
	d.Clusters = all[:]
	if d.NodeID == "" {
		d.NodeID = DefaultNodeID
	}
	if d.NodeCluster == "" {
		d.NodeCluster = DefaultNodeID
	}
	var err error
	if d.Listen, err = bsParseAddr(o.Listen, DefaultEnvoyListen, "Listen"); err != nil {
		return nil, err
	}
	if d.Admin, err = bsParseAddr(o.Admin, DefaultEnvoyAdmin, "Admin"); err != nil {
		return nil, err
	}
	d.AdminURL = d.Admin.String()
	if ip, err := netip.ParseAddr(d.Admin.Host); err == nil && ip.IsUnspecified() {
		d.AdminURL = net.JoinHostPort("localhost", strconv.Itoa(d.Admin.Port))
	}
	hosts := o.NarwhalHosts
	if len(hosts) == 0 {
		hosts = []string{""}
	}
	for _, h := range hosts {
		e, err := bsNarwhalAddr(cfg.Listen.ExtProc, h, "listen.extproc")
		if err != nil {
			return nil, err
		}
		x, err := bsNarwhalAddr(cfg.Listen.XDS, h, "listen.xds")
		if err != nil {
			return nil, err
		}
		d.ExtProc, d.XDS = append(d.ExtProc, e), append(d.XDS, x)
	}
	if d.ExtProcTLS, err = bsTransport(cfg.TLS.ExtProc, "extproc", d.ExtProc, o.TLS); err != nil {
		return nil, err
	}
	if d.XDSTLS, err = bsTransport(cfg.TLS.XDS, "xds", d.XDS, o.TLS); err != nil {
		return nil, err
	}
	if o.TLS != (ClientTLS{}) && d.ExtProcTLS == nil && d.XDSTLS == nil {
		return nil, errors.New("envoy: TLS files given (--tls-ca, --tls-cert, --tls-key) but neither listen.extproc nor listen.xds serves TLS in the Narwhal config (tls.extproc, tls.xds)")
	}
	switch o.BodyMode {
	case "", BodyBuffered:
		d.BodyMode = BodyBuffered
	case BodyFullDuplex:
		d.BodyMode, d.FullDuplex = BodyFullDuplex, true
	default:
		return nil, fmt.Errorf("envoy: body mode must be %s or %s, got %q", BodyBuffered, BodyFullDuplex, o.BodyMode)
	}
	for _, path := range cfg.Router.Paths {
		d.Paths = append(d.Paths, bsRoute{Path: path})
	}
	d.BufferLimit = cfg.Router.BodyLimitBytes + 1<<20
	if d.BufferLimit > math.MaxUint32 {
		return nil, fmt.Errorf("envoy: router.body_limit_bytes %d is above what Envoy can buffer (per_connection_buffer_limit_bytes is a 32-bit count)", cfg.Router.BodyLimitBytes)
	}
	maxWait := config.Seconds(cfg.Router.WaitingSet.MaxWaitS)
	d.MaxWait = fmtDuration(maxWait)
	mt := maxWait + 5*time.Second
	if !d.FullDuplex && mt > time.Hour {
		return nil, fmt.Errorf("envoy: router.waiting_set.max_wait_s %s needs an ext_proc message_timeout of %s, above Envoy's limit of 1h: use %s", d.MaxWait, fmtDuration(mt), BodyFullDuplex)
	}
	d.MessageTimeout = fmtDuration(mt)
	d.StreamIdle = fmtDuration(max(envoyDefaultStreamIdle, (mt + time.Minute).Truncate(time.Second)))
	d.Streams = fleetStreams(cfg)
	if n := o.DiscoveredEngines; n > 0 || cfg.Discovery.Dynamic() {
		if n == 0 {
			n = DefaultDiscoveredEngines
		}
		per := 0
		for _, p := range cfg.Profiles {
			per = max(per, profileStreams(p))
		}
		d.Streams, d.Discovered = d.Streams+n*per, n
	}
	d.ExtProcBreaker = roundUp(d.Capacity+d.Streams, 1024)
	d.OriginalDstBreaker = roundUp(max(d.Streams, 1), 1024)
	return d, nil
}

// bsTransport is the TLS of Envoy's cluster to one Narwhal listener, nil when it is plaintext.
func bsTransport(t config.ListenerTLS, key string, hosts bsAddrs, c ClientTLS) (*bsTLS, error) {
	if !t.Enabled() {
		return nil, nil
	}
	if c.CAFile == "" {
		return nil, fmt.Errorf("envoy: listen.%s serves TLS (tls.%s.cert_file): give the CA file Envoy checks Narwhal's certificate with (--tls-ca)", key, key)
	}
	if t.Mutual() && (c.CertFile == "" || c.KeyFile == "") {
		return nil, fmt.Errorf("envoy: listen.%s requires client certificates (tls.%s.client_ca_file): give Envoy's certificate and key (--tls-cert, --tls-key)", key, key)
	}
	b := &bsTLS{ClientTLS: c, Mutual: t.Mutual()}
	if !b.Mutual {
		b.CertFile, b.KeyFile = "", ""
	}
	for _, h := range hosts {
		san := bsSAN{Type: "DNS", Value: h.Host}
		if ip, err := netip.ParseAddr(h.Host); err == nil {
			// Envoy compares an IP SAN in its canonical text: no zone, IPv4 unmapped, IPv6 short.
			san = bsSAN{Type: "IP_ADDRESS", Value: ip.WithZone("").Unmap().String()}
		}
		if !slices.Contains(b.SANs, san) {
			b.SANs = append(b.SANs, san)
		}
	}
	return b, nil
}

func roundUp(n, m int) int { return (n + m - 1) / m * m }

func bsParseAddr(s, def, what string) (bsAddr, error) {
	if s == "" {
		s = def
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return bsAddr{}, fmt.Errorf("envoy: %s address must be host:port, got %q", what, s)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return bsAddr{}, fmt.Errorf("envoy: %s port must be 1-65535, got %q", what, s)
	}
	if h == "" {
		h = "0.0.0.0"
	}
	return bsAddr{Host: h, Port: port}, nil
}

// bsNarwhalAddr is the address Envoy connects to for a Narwhal listen address.
func bsNarwhalAddr(listen, override, key string) (bsAddr, error) {
	a, err := bsParseAddr(listen, listen, key)
	if err != nil {
		return bsAddr{}, err
	}
	switch ip, err := netip.ParseAddr(a.Host); {
	case override != "":
		a.Host = override
	case err == nil && ip.IsUnspecified():
		a.Host = "127.0.0.1"
		if err == nil && ip.Is6() {
			a.Host = "::1"
		}
	}
	return a, nil
}

// bsQuote writes a YAML double-quoted string.
func bsQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

var bootstrapTemplate = func() *template.Template {
	t := template.Must(template.New("bootstrap").Funcs(template.FuncMap{
		"q":    bsQuote,
		"join": strings.Join,
	}).Parse(bootstrapYAML))
	template.Must(t.New("parts").Parse(bootstrapParts))
	return t
}()

// bootstrapParts are the pieces Narwhal's two gRPC clusters share: how Envoy finds the hosts
// (STATIC for IPs, STRICT_DNS for names), HTTP/2, and the endpoints, one per Narwhal host.
const bootstrapParts = `{{define "discovery"}}
    type: {{if .IsIP}}STATIC{{else}}STRICT_DNS{{end}}
{{- if not .IsIP}}
    dns_lookup_family: V4_PREFERRED
{{- end}}{{end}}
{{- define "http2"}}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive: {interval: 30s, timeout: 5s}{{end}}
{{- define "tls"}}{{if .}}
    # TLS to Narwhal: its certificate must chain to the CA below and name the host Envoy dials;
    # gRPC needs h2 by ALPN.{{if .Mutual}} Envoy presents its own certificate (mutual TLS).{{end}}
    # Envoy reads these files at start: restart it (or serve them by SDS) to rotate them.
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context:
          alpn_protocols: [h2]
          tls_params: {tls_minimum_protocol_version: TLSv1_2}
{{- if .Mutual}}
          tls_certificates:
          - certificate_chain: {filename: {{q .CertFile}}}
            private_key: {filename: {{q .KeyFile}}}
{{- end}}
          validation_context:
            trusted_ca: {filename: {{q .CAFile}}}
            match_typed_subject_alt_names:
{{- range .SANs}}
            - san_type: {{.Type}}
              matcher: {exact: {{q .Value}}}
{{- end}}{{end}}{{end}}
{{- define "endpoints"}}
{{- range .}}
        - endpoint:
            address:
              socket_address: {address: {{q .Host}}, port_value: {{.Port}}}
{{- end}}{{end}}`

const bootstrapYAML = `# Envoy bootstrap for Narwhal, generated by ` + "`narwhal envoy-config`" + ` from the Narwhal config
# (listen.extproc {{.ExtProcListen}}, listen.xds {{.XDSListen}}, xds.cluster_prefix {{.Prefix}}),
# with Envoy listening on {{.Listen}} (admin {{.Admin}}) and reaching Narwhal at {{.ExtProc}}
# (ext_proc) and {{.XDS}} (ADS). Regenerate it rather than editing it; check any copy with
# ` + "`narwhal validate --envoy FILE --config NARWHAL-CONFIG`" + `.
#
# How a request flows:
#   - POST to one of router.paths ({{range $i, $r := .Paths}}{{if $i}}, {{end}}{{$r.Path}}{{end}}): the ext_proc
#     filter hands it to Narwhal (cluster {{.ExtProcCluster}}, request body {{.BodyMode}}), which
#     places it and answers with {{.HeaderDestination}}: IP:port, or rejects it with
#     an OpenAI-style error; the route sends it to that engine through the ORIGINAL_DST cluster
#     {{.OriginalDst}}.
#   - anything else: ext_proc is disabled on that route, client routing headers are removed, and
#     the request goes to a decode engine ({{.Engines}}, subset role={{.RoleDecode}}). Only routes Narwhal
#     processes reach {{.OriginalDst}}, so no client can choose its own upstream.
#   - roles: Narwhal publishes the clusters {{join .Clusters ", "}} over ADS
#     (cluster {{.XDSCluster}}); every endpoint carries filter_metadata {{.LBNamespace}} {role} and narwhal
#     {role, engine_id, lifecycle, pinned}. See them at http://{{.AdminURL}}/clusters and
#     http://{{.AdminURL}}/config_dump?include_eds.

node:
  id: {{q .NodeID}}
  cluster: {{q .NodeCluster}}

admin:
  address:
    socket_address: {address: {{q .Admin.Host}}, port_value: {{.Admin.Port}}}

static_resources:
  listeners:
  - name: narwhal-http
    address:
      socket_address: {address: {{q .Listen.Host}}, port_value: {{.Listen.Port}}}
    # Envoy buffers a request body up to this limit and answers 413 itself beyond it:
    # router.body_limit_bytes ({{.BodyLimit}}) plus 1 MiB, so that Narwhal answers oversized bodies.
    per_connection_buffer_limit_bytes: {{.BufferLimit}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: narwhal
          codec_type: AUTO
          # Routes and Narwhal both see the normalized path.
          normalize_path: true
          merge_slashes: true
          # A request waits in Narwhal's waiting set (up to router.waiting_set.max_wait_s, {{.MaxWait}})
          # without traffic; a stream silent for longer than this is ended.
          stream_idle_timeout: {{.StreamIdle}}
          access_log:
          - name: envoy.access_loggers.stdout
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
              log_format:
                text_format_source:
                  inline_string: "[%START_TIME%] %REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_CODE_DETAILS% upstream=%UPSTREAM_CLUSTER%/%UPSTREAM_HOST% placement=%REQ(X-NARWHAL-PLACEMENT)% prefiller=%REQ(X-PREFILLER-HOST-PORT)% id=%REQ(X-NARWHAL-REQUEST-ID)% %DURATION%ms\n"
          route_config:
            name: narwhal
            # The pass-through route names {{.Engines}}, a cluster that arrives over CDS after
            # this route table has loaded.
            validate_clusters: false
            virtual_hosts:
            - name: narwhal
              domains: ["*"]
              routes:
{{- range .Paths}}
              # {{.Path}} (router.paths): placed by Narwhal, sent to the engine it names.
              - name: {{q (print "narwhal-place " .Path)}}
                match:
                  path: {{q .Path}}
                  headers:
                  - name: ":method"
                    string_match: {exact: POST}
                route:
                  cluster: {{$.OriginalDst}}
                  timeout: 0s  # no deadline: a streamed generation can run long
{{- end}}
              # Everything else passes through unplaced: ext_proc is off here, the client's
              # routing headers are dropped, and it never reaches {{.OriginalDst}}.
              - name: narwhal-passthrough
                match: {prefix: "/"}
                request_headers_to_remove:
{{- range .Headers}}
                - {{.}}
{{- end}}
                route:
                  cluster: {{.Engines}}
                  metadata_match:
                    filter_metadata:
                      {{.LBNamespace}}: {role: {{.RoleDecode}}}
                  timeout: 0s
                typed_per_filter_config:
                  envoy.filters.http.ext_proc:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                    disabled: true
          http_filters:
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {cluster_name: {{.ExtProcCluster}}}
{{- if gt (len .ExtProc) 1}}
                # Several replicas: a stream that cannot open on one (a leader just killed, until
                # the health check sees it) or is refused before Narwhal's first reply opens on
                # another. A stream Narwhal has replied on cannot be retried (docs/ha.md).
                retry_policy:
                  retry_on: connect-failure,refused-stream,reset-before-request,unavailable
                  num_retries: 2
                  retry_back_off: {base_interval: 0.05s, max_interval: 0.5s}
                  retry_host_predicate:
                  - name: envoy.retry_host_predicates.previous_hosts
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate
                  host_selection_retry_max_attempts: 3
{{- end}}
              # Fail closed: if Narwhal cannot be reached, Envoy answers 500 rather than letting
              # an unplaced request through to {{.OriginalDst}}.
              failure_mode_allow: false
              processing_mode:
                request_header_mode: SEND     # Narwhal reads the path and drops client routing headers
{{- if .FullDuplex}}
                request_body_mode: FULL_DUPLEX_STREAMED  # Narwhal gathers the body, places, echoes it back
                request_trailer_mode: SEND    # required with FULL_DUPLEX_STREAMED
{{- else}}
                request_body_mode: BUFFERED   # the whole body in one message; STREAMED cannot carry a placement
                request_trailer_mode: SKIP
{{- end}}
                response_header_mode: SEND    # status and content type settle non-streamed responses
                response_body_mode: STREAMED  # Narwhal observes first token, tokens, usage and end
                response_trailer_mode: SKIP
{{- if .FullDuplex}}
              # Envoy applies no message_timeout in FULL_DUPLEX_STREAMED, so none is set: a request
              # may wait in Narwhal's waiting set for router.waiting_set.max_wait_s ({{.MaxWait}}).
{{- else}}
              # A request Narwhal holds in its waiting set holds the body reply: above
              # router.waiting_set.max_wait_s ({{.MaxWait}}), so Narwhal answers 504 before Envoy does.
              message_timeout: {{.MessageTimeout}}
{{- end}}
              # Narwhal skips the bodies of responses that are not a streamed success.
              allow_mode_override: true
              # Narwhal sends the destination as dynamic metadata {{.LBNamespace}} too.
              metadata_options:
                receiving_namespaces:
                  untyped: [{{.LBNamespace}}]
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router

  clusters:
  # Narwhal's ext_proc server (listen.extproc {{.ExtProcListen}}). Every waiting or in-flight request
  # holds one stream: the circuit breakers cover router.waiting_set.capacity ({{.Capacity}}) plus the
  # fleet's in-flight streams ({{.Streams}}{{if .Discovered}}, {{.Discovered}} discovered engines included{{end}}).
  - name: {{.ExtProcCluster}}{{template "discovery" .ExtProc}}
    connect_timeout: 1s
    # A request body travels to Narwhal in one gRPC message.
    per_connection_buffer_limit_bytes: {{.BufferLimit}}{{template "http2"}}{{template "tls" .ExtProcTLS}}
    circuit_breakers:
      thresholds:
      - priority: DEFAULT
        max_connections: {{.ExtProcBreaker}}
        max_pending_requests: {{.ExtProcBreaker}}
        max_requests: {{.ExtProcBreaker}}
    # gRPC health checking (grpc.health.v1, overall server status).
{{- if gt (len .ExtProc) 1}}
    # Several Narwhal replicas: standbys answer NOT_SERVING, so streams go to the leader only.
{{- end}}
    health_checks:
{{- if gt (len .ExtProc) 1}}
    # Checked every second: a dead leader is out after two failures, a new leader in after one.
    - timeout: 0.5s
      interval: 1s
      unhealthy_threshold: 2
{{- else}}
    - timeout: 1s
      interval: 5s
      unhealthy_threshold: 3
{{- end}}
      healthy_threshold: 1
      grpc_health_check: {}
    load_assignment:
      cluster_name: {{.ExtProcCluster}}
      endpoints:
      - lb_endpoints:{{template "endpoints" .ExtProc}}

  # Narwhal's ADS server (listen.xds {{.XDSListen}}): clusters {{join .Clusters ", "}}.
  - name: {{.XDSCluster}}{{template "discovery" .XDS}}
    connect_timeout: 1s{{template "http2"}}{{template "tls" .XDSTLS}}
    load_assignment:
      cluster_name: {{.XDSCluster}}
      endpoints:
      - lb_endpoints:{{template "endpoints" .XDS}}

  # The engine Narwhal chose: the host comes from the {{.HeaderDestination}} header
  # of each request, which Narwhal overwrites on every request it places. Each request to an
  # engine holds a connection: the circuit breakers cover the fleet's in-flight streams ({{.Streams}}{{if .Discovered}}, {{.Discovered}} discovered engines included{{end}}).
  - name: {{.OriginalDst}}
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 5s
    per_connection_buffer_limit_bytes: {{.BufferLimit}}
    original_dst_lb_config:
      use_http_header: true
      http_header_name: {{.HeaderDestination}}
    circuit_breakers:
      thresholds:
      - priority: DEFAULT
        max_connections: {{.OriginalDstBreaker}}
        max_pending_requests: {{.OriginalDstBreaker}}
        max_requests: {{.OriginalDstBreaker}}

# Engine roles arrive over ADS from Narwhal; the clusters {{join .Clusters ", "}} come from CDS.
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {cluster_name: {{.XDSCluster}}}
  cds_config:
    ads: {}
    resource_api_version: V3
`
