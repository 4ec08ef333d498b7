package bootstrap_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
	"github.com/narwhal-llm/narwhal/problem"
)

// Paths into the generated bootstrap.
const (
	hcmPath     = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config"
	extProcPath = hcmPath + ".http_filters[0].typed_config"
	routesPath  = hcmPath + ".route_config.virtual_hosts[0].routes"
	listenerBuf = "static_resources.listeners[0].per_connection_buffer_limit_bytes"
	extProcCl   = "static_resources.clusters[0]"
	xdsCl       = "static_resources.clusters[1]"
	origDstCl   = "static_resources.clusters[2]"
)

func generate(t testing.TB, cfg *config.Config, o bootstrap.Options) string {
	t.Helper()
	out, err := bootstrap.Generate(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// edit replaces the first occurrence of old in s (which must be there) with new.
func edit(t testing.TB, s, old, new string) string {
	t.Helper()
	if !strings.Contains(s, old) {
		t.Fatalf("edit: %q is not in the document", old)
	}
	return strings.Replace(s, old, new, 1)
}

type want struct {
	path string // exact path of a problem
	msg  string // substring of its message
}

func hasProblem(ps []problem.Problem, w want) bool {
	for _, p := range ps {
		if p.Path == w.path && strings.Contains(p.Msg, w.msg) {
			return true
		}
	}
	return false
}

func dump(ps []problem.Problem) string {
	var b strings.Builder
	for _, p := range ps {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

func TestTestdataGood(t *testing.T) {
	cfg := defaultConfig(t)
	files, err := filepath.Glob("testdata/good-*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/good-*.yaml: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data := readTestdata(t, filepath.Base(f))
			if ps := bootstrap.Validate([]byte(data), cfg); len(ps) > 0 {
				t.Errorf("problems:%s", dump(ps))
			}
			if ps := bootstrap.Validate([]byte(data), nil); len(ps) > 0 {
				t.Errorf("problems without a Narwhal config:%s", dump(ps))
			}
		})
	}
}

// TestRejects is the table of bad bootstraps: each is the generated default (or another good
// one) with one mistake, and must be rejected with a problem at the path of the mistake whose
// message names what is wrong.
func TestRejects(t *testing.T) {
	cfg := defaultConfig(t)
	base := generate(t, cfg, bootstrap.Options{})
	duplex := generate(t, cfg, bootstrap.Options{BodyMode: bootstrap.BodyFullDuplex})
	compose := generate(t, composeConfig(t), composeOptions)
	subset := readTestdata(t, "good-static-subset.yaml")

	cases := []struct {
		name  string
		doc   string
		noCfg bool // validate without a Narwhal config
		want  []want
	}{
		// Proto schema: field names, enums, types, ranges, Any types.
		{name: "typo in a field name inside typed_config",
			doc:  edit(t, base, "processing_mode:", "procesing_mode:"),
			want: []want{{extProcPath + ".procesing_mode", `unknown field "procesing_mode" in envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor; did you mean "processing_mode"?`}}},
		{name: "typo in a top-level field name",
			doc:  edit(t, base, "dynamic_resources:", "dynamic_resource:"),
			want: []want{{"dynamic_resource", `did you mean "dynamic_resources"?`}}},
		{name: "bad enum",
			doc:  edit(t, base, "request_body_mode: BUFFERED ", "request_body_mode: BUFERED "),
			want: []want{{extProcPath + ".processing_mode.request_body_mode", `invalid value "BUFERED" for enum BodySendMode`}, {extProcPath + ".processing_mode.request_body_mode", "did you mean BUFFERED?"}}},
		{name: "duration too large inside typed_config",
			doc:  edit(t, base, "message_timeout: 35s", "message_timeout: 4000s"),
			want: []want{{extProcPath + ".message_timeout", "value must be inside range"}}},
		{name: "negative duration inside typed_config",
			doc:  edit(t, base, "message_timeout: 35s", "message_timeout: -1s"),
			want: []want{{extProcPath + ".message_timeout", "value must be inside range"}}},
		{name: "malformed duration",
			doc:  edit(t, base, "message_timeout: 35s", "message_timeout: 35"),
			want: []want{{extProcPath + ".message_timeout", "must be a duration string"}}},
		{name: "buffer limit of the wrong type",
			doc:  edit(t, base, "per_connection_buffer_limit_bytes: 5242880\n    filter_chains", "per_connection_buffer_limit_bytes: lots\n    filter_chains"),
			want: []want{{listenerBuf, `must be an unsigned 32-bit integer, got "lots"`}}},
		{name: "negative buffer limit",
			doc:  edit(t, base, "per_connection_buffer_limit_bytes: 5242880\n    filter_chains", "per_connection_buffer_limit_bytes: -5\n    filter_chains"),
			want: []want{{listenerBuf, "-5 is out of range"}}},
		{name: "invalid http_header_name",
			doc:  edit(t, base, "http_header_name: x-gateway-destination-endpoint", `http_header_name: "x\ngateway"`),
			want: []want{{origDstCl + ".original_dst_lb_config.http_header_name", `"x\ngateway" is not a valid HTTP header name`}}},
		{name: "port override out of range",
			doc:  edit(t, base, "use_http_header: true", "use_http_header: true\n      upstream_port_override: 70000"),
			want: []want{{origDstCl + ".original_dst_lb_config.upstream_port_override", "value must be less than or equal to 65535"}}},
		{name: "number where a string is due",
			doc:  edit(t, base, "stat_prefix: narwhal", "stat_prefix: 123"),
			want: []want{{hcmPath + ".stat_prefix", "must be a string, got number 123"}}},
		{name: "port out of range",
			doc:  edit(t, base, "port_value: 10000", "port_value: 70000"),
			want: []want{{"static_resources.listeners[0].address.socket_address.port_value", "value must be less than or equal to 65535"}}},
		{name: "unknown typed_config type",
			doc:  edit(t, base, "envoy.extensions.filters.http.router.v3.Router", "envoy.extensions.filters.http.router.v3.Routr"),
			want: []want{{hcmPath + ".http_filters[1].typed_config.@type", `unknown type "type.googleapis.com/envoy.extensions.filters.http.router.v3.Routr"`}}},
		{name: "undefined enum number three Anys deep",
			doc: edit(t, base, `                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                    disabled: true`, `                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                      overrides: {processing_mode: {request_body_mode: 99}}`),
			want: []want{{routesPath + `[2].typed_per_filter_config["envoy.filters.http.ext_proc"].config.overrides.processing_mode.request_body_mode`, "value must be one of the defined enum values"}}},
		{name: "bad base64 (found by protojson, mapped to its path)",
			doc: edit(t, base, "              - name: narwhal-passthrough\n", `              - match: {path: /ping}
                direct_response: {status: 200, body: {inline_bytes: "a"}}
              - name: narwhal-passthrough
`),
			want: []want{{routesPath + "[2].direct_response.body.inline_bytes", "invalid value for bytes field inlineBytes"}}},
		{name: "Any holding a well-known type",
			doc: edit(t, base, `                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                    disabled: true`, `                    "@type": type.googleapis.com/google.protobuf.Struct
                    disabled: true`),
			want: []want{{routesPath + `[2].typed_per_filter_config["envoy.filters.http.ext_proc"].disabled`, `unknown field "disabled": a google.protobuf.Struct in an Any is written as {"@type": ..., "value": ...}`}}},
		{name: "duplicate key",
			doc:  edit(t, base, "  cluster: \"narwhal-envoy\"\n", "  cluster: \"narwhal-envoy\"\n  cluster: again\n"),
			want: []want{{"", `"cluster" already set`}}},
		{name: "not a mapping",
			doc:  "- just\n- a list\n",
			want: []want{{"", "must be a mapping"}}},

		// The ext_proc filter.
		{name: "full duplex with failure_mode_allow",
			doc:  edit(t, duplex, "failure_mode_allow: false", "failure_mode_allow: true"),
			want: []want{{extProcPath + ".failure_mode_allow", "must be false with request_body_mode FULL_DUPLEX_STREAMED"}}},
		{name: "full duplex without trailer SEND",
			doc:  edit(t, duplex, "request_trailer_mode: SEND", "request_trailer_mode: SKIP"),
			want: []want{{extProcPath + ".processing_mode.request_trailer_mode", "must be SEND with request_body_mode FULL_DUPLEX_STREAMED"}}},
		{name: "STREAMED request body",
			doc:  edit(t, base, "request_body_mode: BUFFERED ", "request_body_mode: STREAMED "),
			want: []want{{extProcPath + ".processing_mode.request_body_mode", "STREAMED cannot carry a body-based placement"}}},
		{name: "STREAMED request body without a Narwhal config",
			doc:   edit(t, base, "request_body_mode: BUFFERED ", "request_body_mode: STREAMED "),
			noCfg: true,
			want:  []want{{extProcPath + ".processing_mode.request_body_mode", "STREAMED cannot carry a body-based placement"}}},
		{name: "no request body",
			doc:  edit(t, base, "request_body_mode: BUFFERED ", "request_body_mode: NONE "),
			want: []want{{extProcPath + ".processing_mode.request_body_mode", "Narwhal places a request by its body"}}},
		{name: "response body not streamed",
			doc:  edit(t, base, "response_body_mode: STREAMED", "response_body_mode: BUFFERED"),
			want: []want{{extProcPath + ".processing_mode.response_body_mode", "holds the whole response"}}},
		{name: "fail-open",
			doc:  edit(t, base, "failure_mode_allow: false", "failure_mode_allow: true"),
			want: []want{{extProcPath + ".failure_mode_allow", "must be false: fail-open"}}},
		{name: "message_timeout under max_wait_s",
			doc:  edit(t, base, "message_timeout: 35s", "message_timeout: 20s"),
			want: []want{{extProcPath + ".message_timeout", "is 20s, not above router.waiting_set.max_wait_s (30s)"}}},
		{name: "message_timeout left at Envoy's default",
			doc:  edit(t, base, "message_timeout: 35s\n", ""),
			want: []want{{extProcPath + ".message_timeout", "is 0.2s (the default)"}}},
		{name: "no allow_mode_override",
			doc:  edit(t, base, "allow_mode_override: true", "allow_mode_override: false"),
			want: []want{{extProcPath + ".allow_mode_override", "must be true"}}},
		{name: "envoy.lb not a receiving namespace",
			doc:  edit(t, base, "untyped: [envoy.lb]", "untyped: [narwhal]"),
			want: []want{{extProcPath + ".metadata_options.receiving_namespaces.untyped", `must include "envoy.lb"`}}},
		{name: "observability mode",
			doc:  edit(t, base, "allow_mode_override: true", "allow_mode_override: true\n              observability_mode: true"),
			want: []want{{extProcPath + ".observability_mode", "ignores Narwhal's replies"}}},
		{name: "mutation rules drop Narwhal's headers",
			doc:  edit(t, base, "allow_mode_override: true", "allow_mode_override: true\n              mutation_rules: {disallow_expression: {regex: \"x-gateway-.*\"}}"),
			want: []want{{extProcPath + ".mutation_rules.disallow_expression", "matches x-gateway-destination-endpoint"}}},

		// Routes and clusters.
		{name: "route to a missing cluster",
			doc:  edit(t, base, "cluster: narwhal-original-dst\n", "cluster: narwhal-orignal-dst\n"),
			want: []want{{routesPath + "[0].route.cluster", `cluster "narwhal-orignal-dst" is not defined under static_resources.clusters, and Narwhal's ADS publishes only narwhal-prefill, narwhal-decode, narwhal-engines`}}},
		{name: "route to a missing cluster without a Narwhal config",
			doc:   edit(t, base, "cluster: narwhal-original-dst\n", "cluster: narwhal-orignal-dst\n"),
			noCfg: true,
			want:  []want{{routesPath + "[0].route.cluster", `cluster "narwhal-orignal-dst" is not defined`}}},
		{name: "catch-all route to ORIGINAL_DST without ext_proc",
			doc: edit(t, base, "cluster: narwhal-engines", "cluster: narwhal-original-dst"),
			want: []want{
				{routesPath + "[2].route", "the ext_proc filter is disabled for this route (" + routesPath + `[2].typed_per_filter_config["envoy.filters.http.ext_proc"].disabled)`},
				{routesPath + "[2].match", "must match one exact path"},
			}},
		{name: "catch-all route to ORIGINAL_DST without ext_proc, no Narwhal config",
			doc:   edit(t, base, "cluster: narwhal-engines", "cluster: narwhal-original-dst"),
			noCfg: true,
			want:  []want{{routesPath + "[2].route", "the ext_proc filter is disabled for this route"}}},
		{name: "ORIGINAL_DST route matched by prefix",
			doc:  edit(t, base, `path: "/v1/completions"`, `prefix: "/v1/completions"`),
			want: []want{{routesPath + "[0].match", "must match one exact path"}}},
		{name: "ORIGINAL_DST route on a path Narwhal does not place",
			doc: edit(t, base, `path: "/v1/completions"`, `path: "/v1/embeddings"`),
			want: []want{
				{routesPath + "[0].match.path", `"/v1/embeddings" is not one of router.paths`},
				{routesPath + "[2]", "POST /v1/completions (one of router.paths) takes this route, which does not send to the ORIGINAL_DST cluster"},
			}},
		{name: "ORIGINAL_DST route without a timeout",
			doc:  edit(t, base, "                  timeout: 0s  # no deadline: a streamed generation can run long\n", ""),
			want: []want{{routesPath + "[0].route.timeout", "unset, so 15s"}}},
		{name: "route cluster from a request header",
			doc:  edit(t, base, "cluster: narwhal-engines", "cluster_header: x-cluster"),
			want: []want{{routesPath + "[2].route.cluster_header", "a client could choose narwhal-original-dst"}}},
		{name: "CDS cluster in a route table that validates clusters",
			doc:  edit(t, base, "validate_clusters: false", "validate_clusters: true"),
			want: []want{{hcmPath + ".route_config.validate_clusters", "must be false"}}},
		{name: "route metadata not under envoy.lb",
			doc:  edit(t, base, "envoy.lb: {role: decode}", "narwhal: {role: decode}"),
			want: []want{{routesPath + `[2].route.metadata_match.filter_metadata.narwhal`, `matches only filter_metadata["envoy.lb"]`}}},
		{name: "route metadata key not role",
			doc:  edit(t, base, "envoy.lb: {role: decode}", "envoy.lb: {engine_id: e3}"),
			want: []want{{routesPath + `[2].route.metadata_match.filter_metadata["envoy.lb"].engine_id`, `Narwhal publishes only "role"`}}},
		{name: "subset selector key not role",
			doc:  edit(t, subset, "subset_selectors: [{keys: [role]}]", "subset_selectors: [{keys: [role, engine_id]}]"),
			want: []want{{"static_resources.clusters[3].lb_subset_config.subset_selectors[0].keys[1]", `subset key "engine_id"`}}},
		{name: "static EDS cluster on an assignment Narwhal does not publish",
			doc:  edit(t, subset, "service_name: narwhal-engines", "service_name: engines"),
			want: []want{{"static_resources.clusters[3].eds_cluster_config.service_name", `subscribes to endpoints "engines" over ADS`}}},
		{name: "static cluster shadowing a CDS cluster",
			doc:  edit(t, subset, "- name: narwhal-passthrough", "- name: narwhal-decode"),
			want: []want{{"static_resources.clusters[3].name", "Envoy refuses a CDS update of a static cluster"}}},
		{name: "ORIGINAL_DST reads Envoy's default header",
			doc:  edit(t, base, "      http_header_name: x-gateway-destination-endpoint\n", ""),
			want: []want{{origDstCl + ".original_dst_lb_config.http_header_name", "Narwhal names the destination in x-gateway-destination-endpoint"}}},
		{name: "ORIGINAL_DST with another lb_policy",
			doc:  edit(t, base, "lb_policy: CLUSTER_PROVIDED", "lb_policy: ROUND_ROBIN"),
			want: []want{{origDstCl + ".lb_policy", "needs CLUSTER_PROVIDED"}}},
		{name: "ORIGINAL_DST breakers below the fleet",
			doc:  edit(t, base, "max_connections: 2048", "max_connections: 512"),
			want: []want{{origDstCl + ".circuit_breakers.thresholds[0].max_connections", "max_connections is 512 (1024 when unset), below the fleet's in-flight streams (1040"}}},
		{name: "ext_proc breakers below the waiting set",
			doc:  edit(t, base, "max_requests: 6144", "max_requests: 1024"),
			want: []want{{extProcCl + ".circuit_breakers.thresholds[0].max_requests", "below router.waiting_set.capacity plus the fleet's in-flight streams (4096 + 1040"}}},
		{name: "ext_proc cluster at the wrong port",
			doc:  edit(t, base, "port_value: 9002", "port_value: 9003"),
			want: []want{{extProcCl + ".load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address", "Envoy connects to 127.0.0.1:9003 but listen.extproc is 127.0.0.1:9002: the ports differ"}}},
		{name: "ext_proc cluster without HTTP/2",
			doc: edit(t, base, `    # A request body travels to Narwhal in one gRPC message.
    per_connection_buffer_limit_bytes: 5242880
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive: {interval: 30s, timeout: 5s}
`, ""),
			want: []want{{extProcCl + `.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]`, "must speak HTTP/2"}}},
		{name: "ADS cluster at the wrong port",
			doc:  edit(t, base, "port_value: 18000", "port_value: 18001"),
			want: []want{{xdsCl + ".load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address", "but listen.xds is 127.0.0.1:18000"}}},
		{name: "compose bootstrap against a loopback Narwhal",
			doc:  compose,
			want: []want{{extProcCl + ".load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address", "Envoy connects to narwhal:9002 but listen.extproc is 127.0.0.1:9002, a loopback address"}}},
		{name: "listener buffer below the body limit",
			doc:  edit(t, base, "per_connection_buffer_limit_bytes: 5242880\n    filter_chains", "per_connection_buffer_limit_bytes: 1048576\n    filter_chains"),
			want: []want{{listenerBuf, "the request buffer limit is 1048576 bytes, below router.body_limit_bytes (4194304)"}}},
		{name: "stream idle timeout under the wait",
			doc:  edit(t, base, "stream_idle_timeout: 300s", "stream_idle_timeout: 20s"),
			want: []want{{hcmPath + ".stream_idle_timeout", "is 20s, not above router.waiting_set.max_wait_s (30s)"}}},
		{name: "no ADS",
			doc: base[:strings.Index(base, "# Engine roles arrive")],
			want: []want{
				{"dynamic_resources.ads_config", "missing: Narwhal publishes the engines and their roles over ADS"},
				{"dynamic_resources.cds_config", "missing"},
				{routesPath + "[2].route.cluster", `cluster "narwhal-engines" is not defined`},
			}},
		{name: "ADS with an old transport",
			doc:  edit(t, base, "transport_api_version: V3", "transport_api_version: AUTO"),
			want: []want{{"dynamic_resources.ads_config.transport_api_version", "must be V3"}}},
		{name: "listeners from ADS",
			doc:  edit(t, base, "  cds_config:", "  lds_config: {ads: {}}\n  cds_config:"),
			want: []want{{"dynamic_resources.lds_config", "no listeners"}}},
		{name: "ext_proc after the router",
			doc: edit(t, base, `          http_filters:
          - name: envoy.filters.http.ext_proc`, `          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          - name: envoy.filters.http.ext_proc`),
			want: []want{{hcmPath + ".http_filters[1]", "comes after the router filter"}}},
		{name: "router not last",
			doc: edit(t, base, `          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`, `          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          - name: envoy.filters.http.cors
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors
`),
			want: []want{{hcmPath + ".http_filters[1]", "the router filter must be the last HTTP filter"}}},
		{name: "routes from RDS over ADS",
			doc:  rdsDoc(t, base),
			want: []want{{hcmPath + ".rds", "Narwhal's ADS serves clusters and endpoints only"}}},
		{name: "ext_proc off by default",
			doc:  edit(t, base, "          - name: envoy.filters.http.ext_proc\n", "          - name: envoy.filters.http.ext_proc\n            disabled: true\n"),
			want: []want{{routesPath + "[0].route", "the ext_proc filter is disabled for this route (" + hcmPath + ".http_filters[0].disabled)"}}},
		{name: "ext_proc disabled by FilterConfig on a placed route",
			doc: edit(t, base, "                  timeout: 0s  # no deadline: a streamed generation can run long\n", `                  timeout: 0s
                typed_per_filter_config:
                  envoy.filters.http.ext_proc:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
`),
			want: []want{{routesPath + "[0].route", `the ext_proc filter is disabled for this route (` + routesPath + `[0].typed_per_filter_config["envoy.filters.http.ext_proc"].disabled)`}}},
		{name: "per-route override to STREAMED",
			doc: edit(t, base, "                  timeout: 0s  # no deadline: a streamed generation can run long\n", `                  timeout: 0s
                typed_per_filter_config:
                  envoy.filters.http.ext_proc:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute
                    overrides:
                      processing_mode: {request_body_mode: STREAMED, response_body_mode: STREAMED}
                      failure_mode_allow: true
`),
			want: []want{
				{routesPath + `[0].typed_per_filter_config["envoy.filters.http.ext_proc"].overrides.processing_mode.request_body_mode`, "STREAMED cannot carry a body-based placement"},
				{routesPath + `[0].typed_per_filter_config["envoy.filters.http.ext_proc"].overrides.failure_mode_allow`, "must be false"},
			}},
		{name: "case-insensitive ORIGINAL_DST route",
			doc: edit(t, base, `                  path: "/v1/completions"
`, `                  path: "/v1/completions"
                  case_sensitive: false
`),
			want: []want{{routesPath + "[0].match.case_sensitive", "must not be false"}}},
		{name: "weighted clusters reaching ORIGINAL_DST from the catch-all",
			doc: edit(t, base, "                  cluster: narwhal-engines\n", `                  weighted_clusters:
                    clusters:
                    - {name: narwhal-engines, weight: 90}
                    - {name: narwhal-original-dst, weight: 10}
`),
			want: []want{{routesPath + "[2].route", "the ext_proc filter is disabled for this route"}}},
		{name: "ext_proc over HTTP",
			doc: edit(t, base, "              grpc_service:\n                envoy_grpc: {cluster_name: narwhal-extproc}\n",
				"              http_service: {http_service: {http_uri: {uri: \"http://127.0.0.1:9002\", cluster: narwhal-extproc, timeout: 1s}}}\n"),
			want: []want{{extProcPath + ".http_service", "Narwhal speaks the gRPC ext_proc protocol only"}}},
		{name: "immediate responses disabled",
			doc:  edit(t, base, "allow_mode_override: true", "allow_mode_override: true\n              disable_immediate_response: true"),
			want: []want{{extProcPath + ".disable_immediate_response", "Narwhal answers rejections"}}},
		{name: "request_timeout under the wait",
			doc:  edit(t, base, "stream_idle_timeout: 300s", "stream_idle_timeout: 300s\n          request_timeout: 10s"),
			want: []want{{hcmPath + ".request_timeout", "is 10s, not above router.waiting_set.max_wait_s (30s)"}}},
		{name: "a cluster defined twice",
			doc: edit(t, base, "  - name: narwhal-xds\n", "  - name: narwhal-extproc\n"),
			want: []want{
				{xdsCl + ".name", `cluster "narwhal-extproc" is defined twice (also at static_resources.clusters[0])`},
				{"dynamic_resources.ads_config.grpc_services[0].envoy_grpc.cluster_name", `cluster "narwhal-xds" is not defined`},
			}},
		{name: "no ext_proc filter at all",
			doc: cut(t, base, "          - name: envoy.filters.http.ext_proc\n", "          - name: envoy.filters.http.router\n"),
			want: []want{
				{"static_resources.listeners", "no envoy.filters.http.ext_proc filter"},
				{routesPath + "[0].route", "this connection manager has no ext_proc filter"},
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ps []problem.Problem
			if c.noCfg {
				ps = bootstrap.Validate([]byte(c.doc), nil)
			} else {
				ps = bootstrap.Validate([]byte(c.doc), cfg)
			}
			if len(ps) == 0 {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !hasProblem(ps, w) {
					t.Errorf("want a problem at %q containing %q; got:%s", w.path, w.msg, dump(ps))
				}
			}
			for _, p := range ps {
				if p.Path != "" && p.String() != p.Path+": "+p.Msg {
					t.Errorf("String() = %q", p.String())
				}
			}
		})
	}
}

// cut removes the text of s from the first from up to (not including) the next to.
func cut(t testing.TB, s, from, to string) string {
	t.Helper()
	i := strings.Index(s, from)
	j := strings.Index(s[max(i, 0):], to)
	if i < 0 || j < 0 {
		t.Fatalf("cut: %q ... %q is not in the document", from, to)
	}
	return s[:i] + s[i+j:]
}

// rdsDoc is the generated bootstrap with its routes taken from RDS over ADS.
func rdsDoc(t testing.TB, base string) string {
	t.Helper()
	return edit(t, cut(t, base, "          route_config:\n", "          http_filters:\n"), "          http_filters:\n",
		"          rds: {route_config_name: narwhal, config_source: {ads: {}, resource_api_version: V3}}\n          http_filters:\n")
}

// TestDeepAny makes sure validation descends into Anys: the only mistake is a value out of
// range two typed_configs deep (ext_proc inside the HTTP connection manager), which the
// bootstrap's own ValidateAll does not see.
func TestDeepAny(t *testing.T) {
	cfg := defaultConfig(t)
	doc := edit(t, generate(t, cfg, bootstrap.Options{}), "message_timeout: 35s", "message_timeout: 4000s")

	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatal(err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("the top-level ValidateAll sees it (%v): this test no longer shows the descent", err)
	}

	ps := bootstrap.Validate([]byte(doc), cfg)
	if len(ps) != 1 {
		t.Fatalf("want exactly one problem, got:%s", dump(ps))
	}
	p := ps[0]
	if p.Path != extProcPath+".message_timeout" || !strings.Contains(p.Msg, "value must be inside range [0s, 1h0m0s]") {
		t.Errorf("got %s", p)
	}
	if line := strings.Split(doc, "\n")[p.Line-1]; !strings.Contains(line, "message_timeout: 4000s") {
		t.Errorf("line %d is %q", p.Line, line)
	}
}

// TestWrittenNames checks that a bootstrap written with JSON (lowerCamelCase) field names
// validates, and that problems name the fields as written.
func TestWrittenNames(t *testing.T) {
	cfg := defaultConfig(t)
	js, err := yaml.YAMLToJSONStrict([]byte(generate(t, cfg, bootstrap.Options{})))
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatal(err)
	}
	pj, err := protojson.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	// protojson's spacing is deliberately unstable: re-encode with encoding/json.
	var generic any
	if err := json.Unmarshal(pj, &generic); err != nil {
		t.Fatal(err)
	}
	camel, err := json.MarshalIndent(generic, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(camel), `"messageTimeout": "35s"`) {
		t.Fatalf("protojson did not write camelCase:\n%s", camel)
	}
	if ps := bootstrap.Validate(camel, cfg); len(ps) > 0 {
		t.Fatalf("camelCase bootstrap: problems:%s", dump(ps))
	}
	bad := edit(t, string(camel), `"messageTimeout": "35s"`, `"messageTimeout": "20s"`)
	ps := bootstrap.Validate([]byte(bad), cfg)
	w := want{"staticResources.listeners[0].filterChains[0].filters[0].typedConfig.httpFilters[0].typedConfig.messageTimeout", "is 20s"}
	if !hasProblem(ps, w) {
		t.Errorf("want %v; got:%s", w, dump(ps))
	}
	bad = edit(t, string(camel), `"messageTimeout": "35s"`, `"messageTimeout": "35s", "procesingMode": {}`)
	ps = bootstrap.Validate([]byte(bad), cfg)
	w = want{"staticResources.listeners[0].filterChains[0].filters[0].typedConfig.httpFilters[0].typedConfig.procesingMode", `did you mean "processing_mode"?`}
	if !hasProblem(ps, w) {
		t.Errorf("want %v; got:%s", w, dump(ps))
	}
}

// TestLines checks the line numbers of problems, through anchors and merge keys.
func TestLines(t *testing.T) {
	ps := bootstrap.Validate([]byte("node:\n  id: a\n  id: b\n"), nil)
	if len(ps) != 1 || ps[0].Line != 3 || !strings.Contains(ps[0].Msg, `"id" already set`) {
		t.Errorf("duplicate key: %+v", ps)
	}

	doc := edit(t, readTestdata(t, "good-static-subset.yaml"), "explicit_http_config: {http2_protocol_options: {}}", "explicit_http_config: {http2_protocol_options: {}, bogus: 1}")
	ps = bootstrap.Validate([]byte(doc), nil)
	lines := strings.Split(doc, "\n")
	found := false
	for _, p := range ps {
		if !strings.HasSuffix(p.Path, ".explicit_http_config.bogus") {
			continue
		}
		found = true
		if p.Line == 0 || !strings.Contains(lines[p.Line-1], "bogus") {
			t.Errorf("%s: line %d", p, p.Line)
		}
	}
	if !found {
		t.Errorf("no problem for bogus:%s", dump(ps))
	}
}

// Several Narwhal endpoints in the ext_proc cluster need its gRPC health check (only the leader
// may get streams); each endpoint's port must be listen.extproc's.
func TestReplicasNeedAHealthCheck(t *testing.T) {
	cfg := defaultConfig(t)
	doc := generate(t, cfg, bootstrap.Options{NarwhalHosts: []string{"127.0.0.1", "127.0.0.2"}})
	if ps := bootstrap.Validate([]byte(doc), cfg); len(ps) != 0 {
		t.Fatalf("generated for two replicas:%s", dump(ps))
	}
	bare := cut(t, doc, "    health_checks:\n", "    load_assignment:\n      cluster_name: narwhal-extproc")
	ps := bootstrap.Validate([]byte(bare), cfg)
	if !hasProblem(ps, want{"static_resources.clusters[0].health_checks", "no gRPC health check"}) {
		t.Fatalf("two endpoints, no health check:%s", dump(ps))
	}
	noRetry := cut(t, doc, "                retry_policy:\n", "              # Fail closed")
	if ps := bootstrap.Validate([]byte(noRetry), cfg); !hasProblem(ps, want{"static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters[0].typed_config.grpc_service.retry_policy", "set a retry_policy with retry_on connect-failure"}) {
		t.Fatalf("two endpoints, no retry policy:%s", dump(ps))
	}
	wrongPort := edit(t, doc, `{address: "127.0.0.2", port_value: 9002}`, `{address: "127.0.0.2", port_value: 9003}`)
	if ps := bootstrap.Validate([]byte(wrongPort), cfg); !hasProblem(ps, want{"static_resources.clusters[0].load_assignment.endpoints[0].lb_endpoints[1].endpoint.address.socket_address", "the ports differ"}) {
		t.Fatalf("a replica on the wrong port:%s", dump(ps))
	}
}

// TLS: the bootstrap written for a config with mutual TLS on ext_proc and TLS on xDS validates
// clean; validate --envoy names both sides when only one speaks TLS, and catches a TLS cluster
// that does not check Narwhal's certificate, does not offer h2, or has no client certificate
// where Narwhal requires one. Generate refuses a TLS config without the files Envoy needs.
func TestTLS(t *testing.T) {
	cfg := defaultConfig(t)
	cfg.Listen.ExtProc, cfg.Listen.XDS = "0.0.0.0:9002", "0.0.0.0:18000"
	cfg.TLS.ExtProc = config.ListenerTLS{CertFile: "n.crt", KeyFile: "n.key", ClientCAFile: "ca.crt"}
	cfg.TLS.XDS = config.ListenerTLS{CertFile: "n.crt", KeyFile: "n.key"}
	files := bootstrap.ClientTLS{CAFile: "/tls/ca.crt", CertFile: "/tls/envoy.crt", KeyFile: "/tls/envoy.key"}
	doc := generate(t, cfg, bootstrap.Options{TLS: files, NarwhalHosts: []string{"narwhal"}})
	if ps := bootstrap.Validate([]byte(doc), cfg); len(ps) != 0 {
		t.Fatalf("generated with TLS:%s", dump(ps))
	}
	for _, s := range []string{`matcher: {exact: "narwhal"}`, "san_type: DNS", `private_key: {filename: "/tls/envoy.key"}`} {
		if !strings.Contains(doc, s) {
			t.Errorf("the bootstrap lacks %s", s)
		}
	}
	// xDS is TLS without client certificates: Envoy presents none there.
	xds := doc[strings.Index(doc, "- name: narwhal-xds"):]
	if strings.Contains(xds[:strings.Index(xds, "load_assignment")], "tls_certificates") {
		t.Error("a client certificate on the xDS cluster, whose listener asks for none")
	}

	const socket = extProcCl + ".transport_socket"
	const ctx = socket + ".typed_config.common_tls_context"
	for _, tc := range []struct {
		name string
		doc  string
		want want
	}{
		{"plaintext Envoy, TLS Narwhal", generate(t, defaultConfig(t), bootstrap.Options{}),
			want{socket, `cluster "narwhal-extproc" speaks plaintext but Narwhal serves TLS on listen.extproc (tls.extproc.cert_file)`}},
		{"no h2", edit(t, doc, "alpn_protocols: [h2]", "alpn_protocols: [http/1.1]"), want{ctx + ".alpn_protocols", "must offer h2"}},
		{"no CA", cut(t, doc, "          validation_context:\n", "    circuit_breakers:"), want{ctx + ".validation_context", "Envoy would accept any certificate"}},
		{"no client certificate", cut(t, doc, "          tls_certificates:\n", "          validation_context:"), want{ctx + ".tls_certificates", "requires a client certificate on listen.extproc (tls.extproc.client_ca_file)"}},
		{"no SAN matched", cut(t, doc, "            match_typed_subject_alt_names:\n", "    circuit_breakers:"), want{ctx + ".validation_context.match_typed_subject_alt_names", "Envoy would take any certificate its CA signed"}},
		{"a downstream context", edit(t, doc, "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext", "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"),
			want{socket, "is not an UpstreamTlsContext (envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext)"}},
	} {
		if ps := bootstrap.Validate([]byte(tc.doc), cfg); !hasProblem(ps, tc.want) {
			t.Errorf("%s:%s", tc.name, dump(ps))
		}
	}
	// An explicit raw_buffer socket is plaintext.
	raw := edit(t, generate(t, defaultConfig(t), bootstrap.Options{}), "    circuit_breakers:\n", "    transport_socket:\n      name: envoy.transport_sockets.raw_buffer\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer\n    circuit_breakers:\n")
	if ps := bootstrap.Validate([]byte(raw), cfg); !hasProblem(ps, want{socket, "speaks plaintext but Narwhal serves TLS"}) {
		t.Errorf("raw_buffer against TLS:%s", dump(ps))
	}
	if ps := bootstrap.Validate([]byte(raw), defaultConfig(t)); len(ps) != 0 {
		t.Errorf("raw_buffer against plaintext:%s", dump(ps))
	}
	// IP hosts are matched in Envoy's canonical text.
	v6 := defaultConfig(t)
	v6.Listen.ExtProc, v6.Listen.XDS = "[::]:9002", "[::]:18000"
	v6.TLS = cfg.TLS
	if d := generate(t, v6, bootstrap.Options{TLS: files, NarwhalHosts: []string{"0:0::1"}}); !strings.Contains(d, `matcher: {exact: "::1"}`) {
		t.Errorf("an IPv6 host's SAN is not canonical")
	}
	if ps := bootstrap.Validate([]byte(doc), defaultConfig(t)); !hasProblem(ps, want{socket, `speaks TLS but Narwhal's listen.extproc is plaintext (no tls.extproc.cert_file)`}) ||
		!hasProblem(ps, want{xdsCl + ".transport_socket", "listen.xds is plaintext"}) {
		t.Errorf("TLS Envoy, plaintext Narwhal:%s", dump(ps))
	}

	for _, tc := range []struct {
		o    bootstrap.ClientTLS
		cfg  *config.Config
		want string
	}{
		{bootstrap.ClientTLS{}, cfg, "listen.extproc serves TLS (tls.extproc.cert_file): give the CA file"},
		{bootstrap.ClientTLS{CAFile: "ca"}, cfg, "listen.extproc requires client certificates (tls.extproc.client_ca_file): give Envoy's certificate and key (--tls-cert, --tls-key)"},
		{files, defaultConfig(t), "neither listen.extproc nor listen.xds serves TLS"},
	} {
		if _, err := bootstrap.Generate(tc.cfg, bootstrap.Options{TLS: tc.o}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}
