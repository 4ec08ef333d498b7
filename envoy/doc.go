// Package envoy is Narwhal's runtime edge towards Envoy: the xDS server, translating fleet state
// into EDS/CDS resources with role metadata. The offline Envoy YAML tooling (bootstrap
// generation, validation, lint) is package envoy/bootstrap; the names both share are package wire.
//
// The xDS server (Server) serves ADS over gRPC, state of the world and delta, to any node:
// clusters <prefix>-prefill, <prefix>-decode and <prefix>-engines, and one
// ClusterLoadAssignment for each. Every LbEndpoint carries filter_metadata "narwhal"
// {"role", "engine_id", "lifecycle", "pinned"} and "envoy.lb" {"role"}, and the EDS health of
// its lifecycle. Translate is the pure translation of a fleet snapshot; Server publishes it,
// one EDS version per fleet change that changes an assignment, without re-pushing clusters.
// It decides nothing.
package envoy
