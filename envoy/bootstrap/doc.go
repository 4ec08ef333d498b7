// Package bootstrap is Narwhal's offline Envoy tooling: it writes the Envoy bootstrap that puts
// Envoy in front of Narwhal (Generate, `narwhal envoy-config`), and checks an operator's
// bootstrap (Validate, `narwhal validate --envoy`): strict decoding through Envoy's own protos
// (every extension's typed_config resolved, unknown fields named with a suggestion), then the
// rules protos cannot express — the ext_proc filter, the ORIGINAL_DST cluster, header mutation,
// timeouts against Narwhal's config (lint.go). Nothing here runs in `narwhal serve`; the xDS
// server is package envoy, and the names both share are package wire.
package bootstrap
