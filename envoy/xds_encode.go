package envoy

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/wire"
)

// encoder builds the published assignments from the wire encoding of each endpoint, kept from
// one publish to the next: a fleet change re-encodes only the endpoints it changed (one for a
// role move), instead of marshalling every endpoint of every changed assignment again.
//
// Why it stays (docs/benchmarks.md, "The two places that lean on library internals"): a role
// change reaching 50 ADS clients at 1,000 engines, `go test ./envoy -run XXX -bench
// BenchmarkRoleChange -benchtime 300x`, alternating builds: with the kept encodings p99 31-42 ms,
// 36-38 ms of CPU a change; with go-control-plane's ordinary path (the assignments built as
// messages, as Translate does, and marshalled by the cache) p99 49-95 ms, 58-63 ms of CPU — over
// the goal of 50 ms. Without that need, Translate alone would publish.
//
// An assignment it builds carries its endpoints as the encoded bytes of field
// ClusterLoadAssignment.endpoints (unknown fields to the Go message, so the message's getters
// do not see them); marshalled, it is byte for byte the deterministicMarshal encoding of Translate's
// assignment (xds_encode_test.go checks it). It is for publishing only: read assignments with
// Translate.
type encoder struct {
	endpoints map[member][]byte // encoded LbEndpoint, for the members of the last publish
	head      []byte            // LocalityLbEndpoints.locality, encoded
	tail      []byte            // LocalityLbEndpoints.load_balancing_weight, encoded
}

// deterministicMarshal is go-control-plane's marshalling (cache.MarshalResource).
var deterministicMarshal = proto.MarshalOptions{Deterministic: true}

func newEncoder() *encoder {
	head, err := deterministicMarshal.Marshal(&endpointv3.LocalityLbEndpoints{Locality: &corev3.Locality{Region: LocalityRegion, Zone: LocalityZone}})
	if err != nil {
		panic(err) // a constant message
	}
	tail, err := deterministicMarshal.Marshal(&endpointv3.LocalityLbEndpoints{LoadBalancingWeight: wrapperspb.UInt32(1)})
	if err != nil {
		panic(err)
	}
	return &encoder{endpoints: map[member][]byte{}, head: head, tail: tail}
}

// assignments encodes the assignments of names selected by which, from the members m.
func (e *encoder) assignments(names wire.ClusterNames, m []member, which [3]bool) []*endpointv3.ClusterLoadAssignment {
	next := make(map[member][]byte, len(m))
	lb := map[fleet.Role]*structpb.Struct{}
	for i := range m {
		b, ok := e.endpoints[m[i]]
		if !ok {
			if lb[m[i].role] == nil {
				lb[m[i].role] = &structpb.Struct{Fields: map[string]*structpb.Value{wire.LBRoleKey: structpb.NewStringValue(m[i].role.String())}}
			}
			var err error
			if b, err = deterministicMarshal.Marshal(lbEndpoint(&m[i], lb[m[i].role])); err != nil {
				panic(err) // built from valid strings and enums
			}
		}
		next[m[i]] = b
	}
	e.endpoints = next

	var out []*endpointv3.ClusterLoadAssignment
	for c, name := range names.List() {
		if !which[c] {
			continue
		}
		size := len(e.head) + len(e.tail)
		for i := range m {
			if m[i].inCluster(c) {
				size += protowire.SizeTag(2) + protowire.SizeBytes(len(next[m[i]]))
			}
		}
		// CLA.endpoints (field 2) holds one LocalityLbEndpoints: locality (1), lb_endpoints
		// (2, repeated), load_balancing_weight (3), in field order as proto marshals them.
		raw := make([]byte, 0, protowire.SizeTag(2)+protowire.SizeBytes(size))
		raw = protowire.AppendTag(raw, 2, protowire.BytesType)
		raw = protowire.AppendVarint(raw, uint64(size))
		raw = append(raw, e.head...)
		for i := range m {
			if m[i].inCluster(c) {
				raw = protowire.AppendTag(raw, 2, protowire.BytesType)
				raw = protowire.AppendBytes(raw, next[m[i]])
			}
		}
		raw = append(raw, e.tail...)
		cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
		cla.ProtoReflect().SetUnknown(raw)
		out = append(out, cla)
	}
	return out
}
