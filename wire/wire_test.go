package wire

import (
	"slices"
	"strings"
	"testing"
)

// The names are the contract's: a rename here breaks every deployed Envoy config.
func TestNames(t *testing.T) {
	if got := Names("llm").List(); got != [3]string{"llm-prefill", "llm-decode", "llm-engines"} {
		t.Fatalf("Names(llm) = %v", got)
	}
	want := []string{"x-gateway-destination-endpoint", "x-prefiller-host-port", "x-narwhal-decode-host-port",
		"x-narwhal-placement", "x-narwhal-request-id"}
	if !slices.Equal(Headers, want) {
		t.Fatalf("Headers = %v, want %v", Headers, want)
	}
	for _, h := range Headers {
		if h != strings.ToLower(h) {
			t.Errorf("%s: header names travel lower-case in HTTP/2", h)
		}
	}
	if MetadataNamespace != "narwhal" || LBNamespace != "envoy.lb" || LBRoleKey != "role" {
		t.Fatalf("metadata names %q %q %q", MetadataNamespace, LBNamespace, LBRoleKey)
	}
}
