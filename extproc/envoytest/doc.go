// Package envoytest stands in for Envoy in tests, the way net/http/httptest
// stands in for a network: no Envoy binary runs on the machines Narwhal is
// built and tested on. The Envoy-faithful ext_proc client and gateway live in
// package gateway (which `narwhal load` uses too); this package starts them,
// and ext_proc servers, for the length of a test:
//
//   - [NewTestClient] and [StartGateway]: a gateway.Client or a gateway.Gateway
//     behind an httptest server, closed when the test ends;
//   - [StartServer], [StartServerFunc]: an ext_proc server on a loopback port;
//   - [NullServer]: an ext_proc server that answers every message with the
//     empty reply of the right type, the floor cost of the protocol for
//     benchmarks.
package envoytest
