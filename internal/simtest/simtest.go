// Package simtest runs enginesim engines inside a test process, on ports the system picks.
package simtest

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/narwhal-llm/narwhal/enginesim"
)

// Serve runs an engine with o on 127.0.0.1 and a port the system picks until the test ends, and
// returns its host:port.
func Serve(tb testing.TB, o enginesim.Options) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = enginesim.Serve(ctx, ln, o) })
	tb.Cleanup(func() { cancel(); wg.Wait() })
	return ln.Addr().String()
}
