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
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Placer is the router as the data path uses it (router.Live implements it).
type Placer interface {
	Offer(ctx context.Context, o router.Offer) (router.Outcome, error)
	Invalid()
	FirstToken(h router.Handle) error
	Complete(h router.Handle, outputTokens int) error
	Fail(h router.Handle, why router.Failure) error
	Cancel(h router.Handle) error
	PassThrough(kind router.PassKind, only []string) (addr string, ok bool)
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
	limit   atomic.Int64 // concurrent streams served; more are answered 503 overloaded
	active  atomic.Int64 // streams being served

	// unanswered counts the streams whose request has no routing answer yet (placement,
	// rejection, or pass-through); changed is signalled when it or active drops.
	unanswered atomic.Int64
	changed    signal
}

// signal wakes the goroutines waiting for a condition on the server's counters. It costs one
// atomic load per notify while nobody waits.
type signal struct {
	waiters atomic.Int32
	mu      sync.Mutex
	ch      chan struct{} // closed by notify; nil when nobody waits
}

func (s *signal) notify() {
	if s.waiters.Load() == 0 {
		return
	}
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}

// wait returns when cond holds (checked after every notify), or ctx's error.
func (s *signal) wait(ctx context.Context, cond func() bool) error {
	s.waiters.Add(1)
	defer s.waiters.Add(-1)
	for {
		s.mu.Lock()
		if s.ch == nil {
			s.ch = make(chan struct{})
		}
		ch := s.ch
		s.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Options configure a Server.
type Options struct {
	Router  config.Router
	Placer  Placer
	Sizer   *Sizer
	Metrics *Metrics // nil: no metrics
	Now     func() time.Time
	Logger  *slog.Logger
	// StreamLimit bounds the streams served at once (StreamLimit gives the config's); 0 means
	// no limit.
	StreamLimit int
}

// NewServer returns the ext_proc server.
func NewServer(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Server{
		cfg: o.Router, placer: o.Placer, sizer: o.Sizer, parse: NewParseOptions(o.Router, o.Sizer),
		metrics: o.Metrics, now: o.Now, log: o.Logger,
	}
	s.limit.Store(int64(o.StreamLimit))
	return s
}

// AwaitAnswers waits until every open stream's request has had its routing answer, or ctx
// ends. At shutdown, after the router turned every waiting request away (router.Live
// Shutdown), it lets their 503 replies go out before the server stops.
func (s *Server) AwaitAnswers(ctx context.Context) error {
	return s.changed.wait(ctx, func() bool { return s.unanswered.Load() == 0 })
}

// AwaitIdle waits until no stream is open (each has released what its request held), or ctx
// ends.
func (s *Server) AwaitIdle(ctx context.Context) error {
	return s.changed.wait(ctx, func() bool { return s.active.Load() == 0 })
}

// Streams is the number of ext_proc streams being served.
func (s *Server) Streams() int64 { return s.active.Load() }

// answer records that one stream's request has its answer (or is gone).
func (s *Server) answer() {
	s.unanswered.Add(-1)
	s.changed.notify()
}

// Flow control of the ext_proc listener (docs/memory.md). Fixed windows turn off grpc-go's
// BDP auto-tuning, which grows a stream's receive window to 16 MiB: a client that sends
// without reading (or while its request waits) makes Narwhal buffer at most StreamWindow per
// stream. A message larger than the window still flows at full speed once the stream reads
// it: grpc-go widens the window for the message being read.
const (
	StreamWindow  = 64 << 10
	ConnWindow    = 4 << 20
	MaxHeaderList = 256 << 10 // gRPC request metadata; Envoy sends a few hundred bytes
	// StreamMargin is what StreamLimit allows beyond the waiting set and the engines' decode
	// streams: requests being parsed or answered, and pass-through paths.
	StreamMargin = 1024
)

// StreamLimit is the number of ext_proc streams Narwhal serves at once for a config and the
// fleet's engines: every request the router can hold (router.waiting_set.capacity waiting, and
// the max_streams of every engine that can decode), plus StreamMargin. A fleet that changes
// changes it (SetStreamLimit).
func StreamLimit(cfg *config.Config, engines []fleet.Engine) int {
	n := cfg.Router.WaitingSet.Capacity + StreamMargin
	for _, e := range engines {
		if p, ok := cfg.Profiles[e.Profile]; ok && p.Decode != nil {
			n += p.Decode.MaxStreams
		}
	}
	return n
}

// SetStreamLimit changes the streams served at once (0: no limit); streams beyond a lowered
// limit finish, new ones are refused until the count is under it.
func (s *Server) SetStreamLimit(n int) { s.limit.Store(int64(n)) }

// FollowFleet keeps the stream limit at StreamLimit of the fleet as it changes (the engines that
// can decode bound the streams served) until ctx ends.
func (s *Server) FollowFleet(ctx context.Context, cfg *config.Config, f interface {
	Subscribe() (<-chan struct{}, func())
	Snapshot() fleet.Snapshot
}) {
	changed, stop := f.Subscribe()
	defer stop()
	for {
		s.SetStreamLimit(StreamLimit(cfg, f.Snapshot().Engines)) // at once: a change may precede the subscription
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// MaxStreamsPerConn is the streams one connection may carry: far past any StreamLimit (a fleet
// that grows at run time raises it), which Process enforces stream by stream.
const MaxStreamsPerConn = 1 << 20

// GRPCServerOptions are the gRPC options the ext_proc listener needs: messages larger than
// router.body_limit_bytes are received (so that an oversized body gets Narwhal's 413, not a gRPC
// error), fixed flow-control windows bound what a stream buffers, and one connection may carry
// more streams than StreamLimit (Envoy multiplexes requests on few connections), so that a
// stream over the limit gets its 503 overloaded reply rather than waiting for a stream slot.
func GRPCServerOptions(cfg *config.Config) []grpc.ServerOption {
	limit := int(cfg.Router.BodyLimitBytes) + 1<<20
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(limit),
		grpc.MaxSendMsgSize(limit),
		grpc.MaxConcurrentStreams(MaxStreamsPerConn),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
		grpc.MaxHeaderListSize(MaxHeaderList),
	}
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, s) }

// Process serves one HTTP request's ext_proc stream: receive, step the per-request state
// machine, send its replies. io.EOF and cancellation are normal ends (Envoy is done, or the
// client or upstream went away); whatever the request holds is released.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	defer func() { s.active.Add(-1); s.changed.notify() }()
	if n, limit := s.active.Add(1), s.limit.Load(); limit > 0 && n > limit {
		return s.refuse(ps)
	}
	st := newStream(s, ps.Context())
	defer st.close()
	s.unanswered.Add(1)
	answered := false
	defer func() {
		if !answered {
			s.answer()
		}
	}()
	for {
		req, err := ps.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		out, perr := st.step(req)
		if perr != nil {
			return status.Error(codes.InvalidArgument, perr.Error())
		}
		for _, resp := range out {
			if err := ps.Send(resp); err != nil {
				if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
		clear(out) // a held stream keeps no reply alive
		if !answered && st.phase >= phasePassing {
			answered = true
			s.answer()
		}
		if st.phase == phaseAnswered {
			return nil
		}
	}
}

// routerErr is the data path's one error path for response events (op: first_token, complete,
// fail, cancel) the router refused — a request it no longer knows, which is a bug or a race with
// its own limits: logged with the request id and counted; the exchange goes on.
func (s *Server) routerErr(id, op string, err error) {
	if err == nil {
		return
	}
	s.log.Warn("the router refused a response event", "request_id", id, "event", op, "err", err)
	s.metrics.routerError(op)
}

// refuse answers a stream over the limit: its first message gets a 503 overloaded reply.
func (s *Server) refuse(ps extprocv3.ExternalProcessor_ProcessServer) error {
	s.metrics.streamRefused()
	if _, err := ps.Recv(); err != nil {
		return nil
	}
	_ = ps.Send(immediate(rejection{status: 503, code: "overloaded", retryAfter: 1,
		message: "narwhal is serving " + strconv.FormatInt(s.limit.Load(), 10) + " requests at once, its limit; retry later"}, "narwhal_overloaded"))
	return nil
}

// requestID is Envoy's x-request-id when present, else one of Narwhal's own.
func (s *Server) requestID(fromEnvoy string) string {
	if fromEnvoy != "" {
		return fromEnvoy
	}
	return "nw-" + strconv.FormatUint(s.ids.Add(1), 36)
}

// passKind is what a path outside router.paths asks of an engine: a prompt read and nothing
// generated (embeddings, scoring, tokenizing: vLLM's pooling and tokenizer endpoints), or
// anything else.
func passKind(path string) router.PassKind {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch strings.TrimPrefix(path, "/v1") {
	case "/embeddings", "/score", "/rerank", "/classify", "/pooling", "/tokenize", "/detokenize":
		return router.PassPrompt
	}
	return router.PassAny
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
