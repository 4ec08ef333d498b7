package envoytest

import (
	"net/http/httptest"
	"testing"

	"github.com/narwhal-llm/narwhal/gateway"
)

// NewTestClient dials addr and returns a client for mode; the connection is
// closed when the test ends.
func NewTestClient(tb testing.TB, addr string, mode gateway.Mode) *gateway.Client {
	tb.Helper()
	conn, err := gateway.Dial(addr)
	if err != nil {
		tb.Fatalf("envoytest: dial %s: %v", addr, err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	c, err := gateway.NewClient(conn, mode)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// StartGateway starts a gateway behind an httptest server; both are closed
// when the test ends. Use srv.Client() to reach it.
func StartGateway(tb testing.TB, extprocAddr string, mode gateway.Mode, opts ...gateway.GatewayOption) (*gateway.Gateway, *httptest.Server) {
	tb.Helper()
	g, err := gateway.NewGateway(extprocAddr, mode, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(g)
	tb.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return g, srv
}
