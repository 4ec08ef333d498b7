package envoytest

import (
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc"

	"github.com/narwhal-llm/narwhal/gateway"
)

// NewTestClient dials addr and returns a client for mode; the connection is
// closed when the test ends. opts are added to gateway.Dial's: TLS credentials
// for a Narwhal serving tls.extproc, say.
func NewTestClient(tb testing.TB, addr string, mode gateway.Mode, opts ...grpc.DialOption) *gateway.Client {
	tb.Helper()
	conn, err := gateway.Dial(addr, opts...)
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
