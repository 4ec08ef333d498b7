// Package extproc is Narwhal's Envoy ext_proc server: one gRPC stream per HTTP request, a small
// per-request state machine that parses and sizes the request, asks the router for a placement
// (or a rejection), answers Envoy with the routing headers, and observes the response to its end
// (first token, tokens, usage, end, cancel). It decides nothing itself.
package extproc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/router"
)

// Headers of the contract. Clients may not set any of them: Narwhal removes or overwrites them
// on every request it sees.
const (
	HeaderDestination = "x-gateway-destination-endpoint"
	HeaderPrefiller   = "x-prefiller-host-port"
	HeaderDecode      = "x-narwhal-decode-host-port"
	HeaderPlacement   = "x-narwhal-placement"
	HeaderRequestID   = "x-narwhal-request-id"
	headerPrefix      = "x-narwhal-"
)

// Placer is the router as the data path uses it (router.Live implements it).
type Placer interface {
	Offer(ctx context.Context, o router.Offer) (router.Outcome, error)
	Invalid()
	FirstToken(h router.Handle) error
	Complete(h router.Handle, outputTokens int) error
	Fail(h router.Handle) error
	Cancel(h router.Handle) error
}

var _ Placer = (*router.Live)(nil)

// Server implements Envoy's ExternalProcessor service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     config.Router
	placer  Placer
	sizer   *Sizer
	parse   ParseOptions
	metrics *Metrics
	now     func() time.Time
	log     *slog.Logger
	ids     atomic.Uint64
	shared  shared
}

// Options configure a Server.
type Options struct {
	Router  config.Router
	Placer  Placer
	Sizer   *Sizer
	Metrics *Metrics // nil: no metrics
	Now     func() time.Time
	Logger  *slog.Logger
}

// NewServer returns the ext_proc server.
func NewServer(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Server{
		cfg: o.Router, placer: o.Placer, sizer: o.Sizer, parse: NewParseOptions(o.Router, o.Sizer),
		metrics: o.Metrics, now: o.Now, log: o.Logger,
	}
}

// GRPCServerOptions are the gRPC options the ext_proc listener needs: messages larger than
// router.body_limit_bytes are received (so that an oversized body gets Narwhal's 413, not a gRPC
// error) and Envoy's many concurrent streams on one connection are allowed.
func GRPCServerOptions(cfg config.Router) []grpc.ServerOption {
	limit := int(cfg.BodyLimitBytes) + 1<<20
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(limit),
		grpc.MaxSendMsgSize(limit),
		grpc.MaxConcurrentStreams(1 << 20),
	}
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, s) }

// Process serves one HTTP request's ext_proc stream: receive, step the per-request state
// machine, send its replies. io.EOF and cancellation are normal ends (Envoy is done, or the
// client or upstream went away); whatever the request holds is released.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	st := newStream(s, ps.Context())
	defer st.close()
	for {
		req, err := ps.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		out := st.step(req)
		for _, resp := range out {
			if err := ps.Send(resp); err != nil {
				if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
		clear(out) // a held stream keeps no reply alive
		if st.phase == phaseDone && st.closed {
			return nil
		}
	}
}

// requestID is Envoy's x-request-id when present, else one of Narwhal's own.
func (s *Server) requestID(fromEnvoy string) string {
	if fromEnvoy != "" {
		return fromEnvoy
	}
	return "nw-" + strconv.FormatUint(s.ids.Add(1), 36)
}

// routed reports whether a path (query stripped) is one of router.paths.
func (s *Server) routed(path string) (routed, chat bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for _, p := range s.cfg.Paths {
		if p == path {
			return true, strings.HasSuffix(path, "/chat/completions")
		}
	}
	return false, false
}
