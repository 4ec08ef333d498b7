// Package gateway plays Envoy's part in front of Narwhal and the engines,
// where no Envoy runs: in the tests (through extproc/envoytest) and in
// `narwhal load`, which replays a workload through a live `narwhal serve`.
//
// It has two parts:
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
//
// The behaviour follows Envoy's ext_proc filter sources (ext_proc.cc,
// processor_state.cc, mutation_utils.cc, mutation_rules.cc) and the checklist
// in docs/envoy.md. Where this package simplifies, the doc comment of the
// affected function says so.
package gateway
