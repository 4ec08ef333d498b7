// Package wire holds the names Narwhal and Envoy agree on: the request headers an ext_proc reply
// sets, the endpoint metadata the xDS server publishes, and the clusters it names. The data path
// (extproc), the xDS server (envoy) and the Envoy YAML tooling (envoy/bootstrap) all speak them,
// so they live here, below all three, and nowhere else (the README's header table lists them).
package wire

// Headers of the contract. Clients may not set any of them: Narwhal removes or overwrites them on
// every request it sees.
const (
	// HeaderDestination names the engine an ORIGINAL_DST cluster sends the request to.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderPrefiller names the prefill engine a decode engine pulls the KV cache from (llm-d's
	// convention, router.handoff: decode).
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderDecode names the decode engine a prefill engine hands off to (router.handoff: prefill).
	HeaderDecode = "x-narwhal-decode-host-port"
	// HeaderPlacement is disaggregated or aggregate.
	HeaderPlacement = "x-narwhal-placement"
	// HeaderRequestID is the id Narwhal knows the request by (its log lines and decision records).
	HeaderRequestID = "x-narwhal-request-id"
	// HeaderPrefix starts every header Narwhal owns; a client's are dropped.
	HeaderPrefix = "x-narwhal-"
)

// Headers are the request headers an ext_proc reply may set: header mutation rules must let them
// through.
var Headers = []string{HeaderDestination, HeaderPrefiller, HeaderDecode, HeaderPlacement, HeaderRequestID}

// The Gateway API Inference Extension's subset hint: a gateway may forward, in the filter
// metadata of its ext_proc requests, the endpoints (IP:port) the picker must choose among.
const (
	SubsetNamespace = "envoy.lb.subset_hint"
	SubsetKey       = "x-gateway-destination-endpoint-subset"
)

// Endpoint metadata: the filter_metadata namespaces of every LbEndpoint the xDS server publishes.
const (
	// MetadataNamespace holds {"role", "engine_id", "lifecycle", "pinned"}.
	MetadataNamespace = "narwhal"
	// LBNamespace is the namespace Envoy's subset load balancer reads; it holds {LBRoleKey}.
	LBNamespace = "envoy.lb"
	// LBRoleKey is the only key Narwhal publishes under LBNamespace: the engine's role.
	LBRoleKey = "role"
)

// ClusterNames are the three EDS clusters of a cluster prefix (config xds.cluster_prefix).
type ClusterNames struct {
	Prefill string // every engine whose role is prefill, whatever its lifecycle
	Decode  string // every engine whose role is decode, whatever its lifecycle
	Engines string // every engine
}

// Names returns the cluster names of prefix: <prefix>-prefill, <prefix>-decode, <prefix>-engines.
func Names(prefix string) ClusterNames {
	return ClusterNames{Prefill: prefix + "-prefill", Decode: prefix + "-decode", Engines: prefix + "-engines"}
}

// List returns the names in resource order: prefill, decode, engines.
func (n ClusterNames) List() [3]string { return [3]string{n.Prefill, n.Decode, n.Engines} }
