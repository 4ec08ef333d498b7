package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// shutdownGrace is how long Run lets in-flight requests finish after ctx is done; then the
// engine closes (pending requests fail) and connections are cut.
const shutdownGrace = 10 * time.Second

// Run serves an engine on addr until ctx is done, then shuts down gracefully. A listen error
// (a port in use, say) is returned at once.
func Run(ctx context.Context, addr string, o Options) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("enginesim: listen on %s: %w", addr, err)
	}
	return Serve(ctx, ln, o)
}

// Serve serves an engine on ln until ctx is done, then shuts down gracefully; it closes ln.
func Serve(ctx context.Context, ln net.Listener, o Options) error {
	addr := ln.Addr().String()
	e := New(o)
	defer e.Close()
	srv := &http.Server{
		Handler:           e,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	e.log.Info("enginesim serving", "addr", ln.Addr().String(), "role", o.Role, "model", e.opts.Model)

	select {
	case err := <-served:
		return fmt.Errorf("enginesim: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		e.log.Warn("enginesim: grace period over; failing in-flight requests", "err", err)
		e.Close()
		_ = srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("enginesim: serve on %s: %w", addr, err)
	}
	return nil
}
