package envoy

import (
	"net/netip"
	"slices"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/wire"
)

// The one locality every ClusterLoadAssignment has (grpc-go's xDS client rejects a locality
// without region and zone), and the clusters' connect timeout. The wire names (metadata
// namespaces, cluster names) are package wire's.
const (
	// LocalityRegion and LocalityZone name the single locality of every assignment.
	LocalityRegion = "narwhal"
	LocalityZone   = "local"
	// ConnectTimeout is the connect timeout of every cluster.
	ConnectTimeout = time.Second
)

// Resources is the xDS translation of one fleet snapshot: a value, built fresh, never changed
// afterwards (messages may share sub-messages, such as an LbEndpoint listed in a role's
// assignment and in the engines assignment).
type Resources struct {
	FleetVersion uint64
	// Clusters and Assignments are in the order prefill, decode, engines.
	Clusters    []*clusterv3.Cluster
	Assignments []*endpointv3.ClusterLoadAssignment
	// Skipped lists the engines left out of every assignment, in fleet order.
	Skipped []Skipped
}

// Skipped is an engine the translation left out: its address is not IP:port (a host name not
// resolved yet: Envoy and grpc-go reject a whole assignment for one such endpoint), or another
// engine earlier in the fleet has the same address (grpc-go rejects duplicates).
type Skipped struct {
	Engine string `json:"engine"`
	Addr   string `json:"address"`
	Reason string `json:"reason"`
}

// Translate builds the clusters and assignments of one fleet snapshot. The same snapshot gives
// the same resources: endpoints are in fleet order.
func Translate(prefix string, s *fleet.Snapshot) Resources {
	names := wire.Names(prefix)
	m, skipped := fleetMembers(s.Engines)
	r := Resources{FleetVersion: s.Version, Clusters: Clusters(prefix), Skipped: skipped}
	eps := buildEndpoints(m)
	for i, name := range names.List() {
		r.Assignments = append(r.Assignments, buildAssignment(name, pickEndpoints(m, eps, i)))
	}
	return r
}

// Clusters returns the three EDS clusters of prefix: fed by ADS, round robin, panic mode off
// (an engine Narwhal marks DRAINING or UNHEALTHY never takes traffic, however few are
// healthy). The engines cluster adds subset load balancing on the endpoints' envoy.lb "role";
// the role clusters hold nothing grpc-go's xDS client rejects.
func Clusters(prefix string) []*clusterv3.Cluster {
	names := wire.Names(prefix)
	engines := edsCluster(names.Engines)
	engines.LbSubsetConfig = &clusterv3.Cluster_LbSubsetConfig{
		// A route without metadata_match uses every engine; a route that asks for a role gets
		// only that role's engines, and no fallback when there is none.
		FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_ANY_ENDPOINT,
		SubsetSelectors: []*clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector{{
			Keys:           []string{wire.LBRoleKey},
			FallbackPolicy: clusterv3.Cluster_LbSubsetConfig_LbSubsetSelector_NO_FALLBACK,
		}},
	}
	return []*clusterv3.Cluster{edsCluster(names.Prefill), edsCluster(names.Decode), engines}
}

func edsCluster(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
		EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{EdsConfig: &corev3.ConfigSource{
			ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}},
			ResourceApiVersion:    corev3.ApiVersion_V3,
		}},
		ConnectTimeout: durationpb.New(ConnectTimeout),
		LbPolicy:       clusterv3.Cluster_ROUND_ROBIN,
		CommonLbConfig: &clusterv3.Cluster_CommonLbConfig{HealthyPanicThreshold: &typev3.Percent{Value: 0}},
	}
}

// member is what one endpoint's resource depends on: two fleets with equal members give equal
// assignments, so comparing members tells which assignments changed.
type member struct {
	id        string
	addr      netip.AddrPort
	role      fleet.Role
	lifecycle fleet.Lifecycle
	pinned    bool
}

// fleetMembers lists the engines that can be endpoints, in fleet order.
func fleetMembers(engines []fleet.Engine) ([]member, []Skipped) {
	out := make([]member, 0, len(engines))
	var skipped []Skipped
	seen := make(map[netip.AddrPort]string, len(engines))
	for i := range engines {
		e := &engines[i]
		ap, err := netip.ParseAddrPort(e.Addr)
		if err != nil || ap.Port() == 0 {
			skipped = append(skipped, Skipped{Engine: e.ID, Addr: e.Addr, Reason: "address is not IP:port (not resolved yet)"})
			continue
		}
		ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		if other, dup := seen[ap]; dup {
			skipped = append(skipped, Skipped{Engine: e.ID, Addr: e.Addr, Reason: "same address as engine " + other})
			continue
		}
		seen[ap] = e.ID
		out = append(out, member{id: e.ID, addr: ap, role: e.Role, lifecycle: e.Lifecycle, pinned: e.Pinned})
	}
	return out, skipped
}

// inCluster reports whether m belongs to cluster i (0 prefill, 1 decode, 2 engines).
func (m *member) inCluster(i int) bool {
	switch i {
	case 0:
		return m.role == fleet.Prefill
	case 1:
		return m.role == fleet.Decode
	}
	return true
}

// splitMembers returns the members of each cluster, in fleet order.
func splitMembers(m []member) [3][]member {
	var out [3][]member
	for i := range out {
		for j := range m {
			if m[j].inCluster(i) {
				out[i] = append(out[i], m[j])
			}
		}
	}
	return out
}

// buildEndpoints builds one LbEndpoint per member (shared by the role and engines assignments).
func buildEndpoints(m []member) []*endpointv3.LbEndpoint {
	out := make([]*endpointv3.LbEndpoint, len(m))
	lb := map[fleet.Role]*structpb.Struct{}
	for i := range m {
		if lb[m[i].role] == nil {
			lb[m[i].role] = &structpb.Struct{Fields: map[string]*structpb.Value{wire.LBRoleKey: structpb.NewStringValue(m[i].role.String())}}
		}
		out[i] = lbEndpoint(&m[i], lb[m[i].role])
	}
	return out
}

func pickEndpoints(m []member, eps []*endpointv3.LbEndpoint, cluster int) []*endpointv3.LbEndpoint {
	var out []*endpointv3.LbEndpoint
	for j := range m {
		if m[j].inCluster(cluster) {
			out = append(out, eps[j])
		}
	}
	return out
}

func lbEndpoint(m *member, lb *structpb.Struct) *endpointv3.LbEndpoint {
	return &endpointv3.LbEndpoint{
		HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Protocol:      corev3.SocketAddress_TCP,
				Address:       m.addr.Addr().String(),
				PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(m.addr.Port())},
			}}},
		}},
		HealthStatus: HealthStatus(m.lifecycle),
		Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			wire.MetadataNamespace: {Fields: map[string]*structpb.Value{
				"role":      structpb.NewStringValue(m.role.String()),
				"engine_id": structpb.NewStringValue(m.id),
				"lifecycle": structpb.NewStringValue(m.lifecycle.String()),
				"pinned":    structpb.NewBoolValue(m.pinned),
			}},
			wire.LBNamespace: lb,
		}},
	}
}

// HealthStatus is the EDS health of a lifecycle: HEALTHY for active, DRAINING for draining and
// for an engine held while it switches role in place, UNHEALTHY for failed and recovering.
func HealthStatus(l fleet.Lifecycle) corev3.HealthStatus {
	switch l {
	case fleet.Active:
		return corev3.HealthStatus_HEALTHY
	case fleet.Draining, fleet.Switching:
		return corev3.HealthStatus_DRAINING
	}
	return corev3.HealthStatus_UNHEALTHY
}

// buildAssignment builds one ClusterLoadAssignment with its single weighted locality (also when it
// has no endpoints).
func buildAssignment(name string, eps []*endpointv3.LbEndpoint) *endpointv3.ClusterLoadAssignment {
	return &endpointv3.ClusterLoadAssignment{
		ClusterName: name,
		Endpoints: []*endpointv3.LocalityLbEndpoints{{
			Locality:            &corev3.Locality{Region: LocalityRegion, Zone: LocalityZone},
			LoadBalancingWeight: wrapperspb.UInt32(1),
			LbEndpoints:         eps,
		}},
	}
}

// changedClusters reports which clusters' members differ between two splits.
func changedClusters(prev, next [3][]member) [3]bool {
	var out [3]bool
	for i := range out {
		out[i] = !slices.Equal(prev[i], next[i])
	}
	return out
}
