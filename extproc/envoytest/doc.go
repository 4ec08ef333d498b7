// Package envoytest stands in for Envoy in tests, the way net/http/httptest
// stands in for a network: no Envoy binary runs on the machines Narwhal is
// built and tested on.
//
// It has three parts:
//
//   - [Client] and [Exchange]: an ext_proc client that drives one Process
//     stream per HTTP request exactly as Envoy's ext_proc filter does (message
//     order per processing mode, waiting for replies, message_timeout,
//     failure_mode_allow, header mutation rules, mode_override,
//     dynamic-metadata namespaces, ImmediateResponse, early close on cancel)
//     and records what Envoy would have done as a [Record]: final headers,
//     local reply, dynamic metadata, route-cache clearing, timings, and every
//     [Violation] of the protocol a correct server must never cause.
//   - [Gateway]: an http.Handler that plays Envoy in front of engines: it
//     runs the request phases through an Exchange, routes the request the way
//     an ORIGINAL_DST cluster reading x-gateway-destination-endpoint does,
//     streams the engine's response back chunk by chunk through the response
//     phases, and records an [Outcome] per request.
//   - [NullServer]: an ext_proc server that answers every message with the
//     empty reply of the right type, the floor cost of the protocol for
//     benchmarks.
//
// The behaviour follows Envoy's ext_proc filter sources (ext_proc.cc,
// processor_state.cc, mutation_utils.cc, mutation_rules.cc) and the checklist
// in the Narwhal design notes (docs/envoy.md). Where this package simplifies,
// the doc comment of the affected function says so.
package envoytest
