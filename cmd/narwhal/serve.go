package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/narwhal-llm/narwhal/admin"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/discovery"
	"github.com/narwhal-llm/narwhal/engineclient"
	"github.com/narwhal-llm/narwhal/envoy"
	"github.com/narwhal-llm/narwhal/extproc"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/ha"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/state"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

func newServe(g *globalFlags, stderr io.Writer) *cobra.Command {
	var path, decisions string
	var reset bool
	cmd := &cobra.Command{
		Use:   "serve [--config FILE]",
		Short: "Run Narwhal until SIGINT/SIGTERM (the embedded default config without --config)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := g.logger(stderr)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			var dlog io.Writer
			if decisions != "" {
				f, err := os.OpenFile(decisions, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
				if err != nil {
					return failureErr(fmt.Errorf("--decisions: %w", err))
				}
				defer f.Close()
				dlog = f
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve(ctx, cfg, log, dlog, reset)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "config file (YAML)")
	cmd.Flags().StringVar(&decisions, "decisions", "", "write the decision log (JSON lines) to this file")
	cmd.Flags().BoolVar(&reset, "reset-state", false, "ignore the durable state (state.dir) and start from the config's roles")
	return cmd
}

// serve runs Narwhal on a validated config until ctx is done, then shuts down within
// shutdown_grace_s: readiness drops, new ext_proc streams are refused, residents finish (up to
// the grace), then the xDS and admin servers stop. Listeners open first, so that a port in use
// fails before anything runs. The durable state of an earlier run (state.dir) is restored first,
// unless resetState. Three steps: build (nothing runs yet), run, shut down.
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger, decisions io.Writer, resetState bool) error {
	s, err := build(ctx, cfg, log, decisions, resetState)
	if err != nil {
		return err
	}
	defer s.release()
	return s.shutdown(s.run(ctx))
}

// server is a built `narwhal serve`: its listeners open, the fleet restored, every server and
// loop constructed, nothing running until run.
type server struct {
	cfg *config.Config
	log *slog.Logger

	adminLn, extprocLn, xdsLn net.Listener
	// healthLn and healthSrv serve the gRPC health service alone (listen.health); nil when off.
	healthLn  net.Listener
	healthSrv *grpc.Server
	releases  []func() // undone at the end, last first: the state lock, the replica's lease

	f        *fleet.Fleet
	rep      *ha.Replica // replicas on etcd or a Lease (docs/ha.md); nil for a single instance
	dlog     *decisionlog.Log
	live     *router.Live
	roles    *controller.Live
	persist  *state.Writer
	rec      *admin.Recorder
	xds      *envoy.Server
	xdsSrv   *grpc.Server
	grpcSrv  *grpc.Server
	health   *grpchealth.Server
	ext      *extproc.Server
	adm      *admin.Server
	adminSrv *http.Server
	tls      *tlsfiles.Listeners
	monitor  *controller.Monitor
	switcher *controller.Switcher
	// engineMetrics reads the engines' own metrics into the router (health.metrics).
	engineMetrics *engineclient.MetricsReader
	files         *discovery.File       // the endpoints file (docs/discovery.md); nil without one
	kube          *discovery.Kubernetes // pods as engines (docs/kubernetes.md); nil without

	wg     sync.WaitGroup
	errc   chan error
	runCtx context.Context
	cancel context.CancelFunc
}

// build opens the listeners, restores the fleet and constructs everything serve runs, its
// servers and loops to live within ctx. On an error everything it opened is closed again.
func build(ctx context.Context, cfg *config.Config, log *slog.Logger, decisions io.Writer, resetState bool) (_ *server, err error) {
	token, err := cfg.Admin.ResolveToken()
	if err != nil {
		return nil, usageErr(err)
	}
	cfg.Admin.Token = token // the admin server compares with it
	s := &server{cfg: cfg, log: log, errc: make(chan error, 1)}
	if s.tls, err = tlsfiles.NewListeners(cfg.TLS, log); err != nil {
		return nil, failureErr(err)
	}
	lns, err := listenAll(cfg)
	if err != nil {
		return nil, err
	}
	s.adminLn, s.extprocLn, s.xdsLn = lns[0], lns[1], lns[2]
	if len(lns) > 3 {
		s.healthLn = lns[3]
	}
	defer func() {
		if err != nil {
			closeAll(lns)
			s.release()
		}
	}()
	start := time.Now()
	f, err := fleet.New(cfg, start)
	if err != nil {
		return nil, usageErr(err)
	}
	s.f = f
	if cfg.HA.Enabled() {
		host, _ := os.Hostname()
		if s.rep, err = dialReplica(cfg, host+"/"+s.adminLn.Addr().String(), log); err != nil {
			return nil, failureErr(err)
		}
		s.releases = append(s.releases, s.rep.Resign)
	}
	rep := s.rep
	defaultDir := cfg.State.Dir == ""
	if rep == nil { // one process per state directory (replicas keep theirs in the shared store)
		if cfg.State.Dir, err = filepath.Abs(cfg.State.StateDir()); err != nil {
			return nil, failureErr(fmt.Errorf("state.dir: %w", err))
		}
		lock, err := state.Acquire(cfg.State.Dir)
		if err != nil {
			return nil, failureErr(err)
		}
		s.releases = append(s.releases, func() { _ = lock.Release() })
	}
	saved, err := loadState(cfg, f, resetState, rep, log)
	if err != nil {
		return nil, failureErr(err)
	}
	if rep == nil && defaultDir && saved == nil && !resetState {
		warnLegacyState(cfg, log)
	}
	sizer, err := extproc.NewSizer(cfg.Router.Sizing)
	if err != nil {
		return nil, usageErr(fmt.Errorf("router.sizing: %w", err))
	}
	if decisions != nil {
		s.dlog = decisionlog.New(decisions, start, cfg, f.Snapshot())
	}
	f.OnChange(func(ev fleet.Event) {
		level := slog.LevelInfo
		if ev.Kind == fleet.EventRestored { // a standby takes its leader's every write
			level = slog.LevelDebug
		}
		log.Log(context.Background(), level, "fleet change", "version", ev.Version, "kind", ev.Kind, "engine", ev.Engine,
			"from", ev.From, "to", ev.To, "pinned", ev.Pinned, "drained", ev.Held, "cause", ev.Cause)
		s.dlog.Fleet(ev)
	})
	reg := prometheus.NewRegistry()
	metrics := admin.NewMetrics(reg, f, version)
	triggers := controller.NewTriggers() // the router's urgent triggers, for the role controller
	rt := router.New(cfg, f.Snapshot(), start)
	s.live = router.NewLive(rt, time.Now, router.Hooks{
		Eject:   func(e router.Ejection) { eject(f, e, log) },
		Trigger: triggers.Put,
	})
	ctl := controller.New(cfg, start)
	save := func(st *state.File) error { return state.Save(cfg.State.StateDir(), st) }
	if rep != nil {
		save = rep.Save
		rep.Register(reg)
	}
	s.persist = state.NewWriter(state.WriterOptions{Save: save, Logger: log,
		Loads: func() []router.EngineLoad { return s.live.Snapshot().Engines }, Failed: s.writeFailed}, reg)
	s.rec = admin.NewRecorder(cfg, start, f, s.live, reg)
	var persistDecision func(*decisionlog.Decision, controller.Durable) error
	if rep != nil { // no decision, and so no role move, that a replica cannot persist
		persistDecision = rep.PersistDecision(f, func() []router.EngineLoad { return s.live.Snapshot().Engines })
	}
	s.roles = controller.NewLive(ctl, controller.LiveOptions{
		Fleet: f, Router: s.live, Logger: log, Observer: controller.Observers{admin.NewControllerMetrics(reg), s.persist, s.rec}, Log: s.dlog,
		Persist: persistDecision, Triggers: triggers,
	})
	s.restore(saved) // the fleet's part is restored already (loadState), before the router saw it
	f.OnChange(func(fleet.Event) { s.persist.Kick() })
	admin.RegisterRouter(reg, s.live)
	s.runCtx, s.cancel = context.WithCancel(ctx) // the servers' and loops' life; ended after the drain at the latest
	s.xds = envoy.NewServer(s.runCtx, cfg.XDS.ClusterPrefix, f, log, reg)
	s.xds.Restrict(cfg.XDS.Nodes, cfg.XDS.Identities)
	s.xdsSrv = grpc.NewServer(append(envoy.ServerOptions(), tlsfiles.GRPCCreds(s.tls.XDS)...)...)
	s.xds.Register(s.xdsSrv)
	s.tls.Register(reg)
	var haState func() admin.HAState
	if rep != nil {
		haState = rep.State
	}
	if cfg.Discovery.File.Path != "" {
		s.files = &discovery.File{Path: cfg.Discovery.File.Path, Resync: config.Seconds(cfg.Discovery.File.ResyncS),
			Source: discovery.NewSource(discovery.SourceFile, cfg), Fleet: f, Now: time.Now, Log: log}
	}
	if kc := cfg.Discovery.Kubernetes; kc.Enabled() {
		if s.kube, err = newKubernetes(cfg, f, log); err != nil {
			s.cancel()
			return nil, failureErr(err)
		}
	}
	s.adm = admin.New(admin.Options{Config: cfg, Fleet: f, Gatherer: reg, Registerer: reg, Now: time.Now, Start: start, Logger: log,
		Router: s.live, Sizing: sizer.Errors, XDS: s.xds, Controller: s.roles, HA: haState, History: s.rec.Ring, Discovery: s.discoveryState(),
		TLS: s.tls.StatusFunc()})
	s.grpcSrv = grpc.NewServer(append(extproc.GRPCServerOptions(cfg), tlsfiles.GRPCCreds(s.tls.ExtProc)...)...)
	s.health = grpchealth.NewServer() // Envoy's ext_proc cluster health-checks over gRPC
	// The service names GIE's picker charts probe: liveness answers while the process runs,
	// readiness and inference-extension as "" (the leader's).
	s.health.SetServingStatus(healthLiveness, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpcSrv, s.health)
	if s.healthLn != nil { // the same status on a port of its own, plaintext (listen.health)
		s.healthSrv = grpc.NewServer()
		healthpb.RegisterHealthServer(s.healthSrv, s.health)
	}
	s.ext = extproc.NewServer(extproc.Options{Router: cfg.Router, Placer: s.live, Sizer: sizer,
		Metrics: extproc.NewMetrics(reg), Logger: log, StreamLimit: extproc.StreamLimit(cfg, f.Snapshot().Engines)})
	s.ext.Register(s.grpcSrv)
	s.adminSrv = admin.DefaultLimits.HTTPServer(s.adm, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	if s.tls.Admin != nil {
		s.adminSrv.TLSConfig = s.tls.Admin.Config()
	}
	prober := &engineclient.HTTPProber{
		Client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: 30 * time.Second}},
		Path:    cfg.Health.Path,
		Targets: map[string]config.EngineHealth{},
	}
	for _, e := range cfg.Engines {
		if e.Health != (config.EngineHealth{}) {
			prober.Targets[e.Address] = e.Health
		}
	}
	s.monitor = controller.NewMonitor(cfg.Health, f, prober, time.Now, time.After, metrics, log)
	s.engineMetrics = engineclient.NewMetricsReader(cfg, f, s.live, log, reg)
	s.switcher = &controller.Switcher{Fleet: f, Router: s.live, Logger: log, Now: time.Now, Timeout: config.Seconds(cfg.Controller.SwitchTimeoutS),
		Client: engineclient.SGLangSwitch{Client: &http.Client{}}} // engines with switch: sglang
	return s, nil
}

// discoveryState is /narwhal/state's discovery: nil without a source.
func (s *server) discoveryState() func() admin.DiscoveryState {
	if s.files == nil && s.kube == nil {
		return nil
	}
	return func() admin.DiscoveryState {
		var st admin.DiscoveryState
		if s.files != nil {
			fs := s.files.Status()
			st.File = &fs
		}
		if s.kube != nil {
			ks := s.kube.Status()
			st.Kubernetes = &ks
		}
		return st
	}
}

// warnLegacyState points at a state left where state.dir "" kept it before (./narwhal-state)
// rather than start over silently.
func warnLegacyState(cfg *config.Config, log *slog.Logger) {
	old, err := filepath.Abs(filepath.Join(config.LegacyStateDir, state.FileName))
	if err != nil || old == filepath.Join(cfg.State.Dir, state.FileName) {
		return
	}
	if _, err := os.Stat(old); err == nil {
		log.Warn("a durable state is in ./narwhal-state, where state.dir \"\" kept it before; this run keeps its state in "+cfg.State.Dir+": set state.dir to "+filepath.Dir(old)+" to continue from it",
			"old", old, "state_dir", cfg.State.Dir)
	}
}

// release undoes what build took (the state lock, the replica's lease), last first.
func (s *server) release() {
	for i := len(s.releases) - 1; i >= 0; i-- {
		s.releases[i]()
	}
	s.releases = nil
}

// fail records the first failure, which stops serve; later ones add nothing.
func (s *server) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
}

// run starts the servers and loops and waits until ctx is done or one fails; it returns that
// failure (nil for ctx).
func (s *server) run(ctx context.Context) error {
	cfg, log, f := s.cfg, s.log, s.f
	engineclient.ResolveFleet(ctx, f, config.Seconds(cfg.Health.TimeoutS), log) // placements carry IP:port from the first request on
	s.wg.Go(func() {
		serveAdmin := s.adminSrv.Serve
		if s.tls.Admin != nil {
			serveAdmin = func(ln net.Listener) error { return s.adminSrv.ServeTLS(ln, "", "") }
		}
		if err := serveAdmin(s.adminLn); !errors.Is(err, http.ErrServerClosed) {
			s.fail(fmt.Errorf("admin server: %w", err))
		}
	})
	s.wg.Go(func() {
		if err := s.grpcSrv.Serve(s.extprocLn); err != nil {
			s.fail(fmt.Errorf("ext_proc server: %w", err))
		}
	})
	s.wg.Go(func() {
		if err := s.xdsSrv.Serve(s.xdsLn); err != nil {
			s.fail(fmt.Errorf("xDS server: %w", err))
		}
	})
	if s.healthSrv != nil {
		s.wg.Go(func() {
			if err := s.healthSrv.Serve(s.healthLn); err != nil {
				s.fail(fmt.Errorf("gRPC health server: %w", err))
			}
		})
	}
	runCtx := s.runCtx
	s.wg.Go(func() { _ = s.xds.Run(runCtx) })
	s.wg.Go(func() { _ = s.live.Run(runCtx) })
	s.wg.Go(func() { s.live.Follow(runCtx, f) })
	s.wg.Go(func() { s.ext.FollowFleet(runCtx, cfg, f) })
	s.wg.Go(func() { s.rec.Run(runCtx, config.Seconds(cfg.Admin.History.IntervalS)) })
	if s.rep == nil {
		s.lead()
	} else {
		// A standby answers Envoy's health check NOT_SERVING (streams go to the leader) and
		// /readyz 503, and serves xDS from the leader's state.
		setServing(s.health, healthpb.HealthCheckResponse_NOT_SERVING)
		s.wg.Go(func() { s.rep.Lead(runCtx, f, s.take, s.lead, s.fail) })
	}
	p, d := 0, 0 // the roles serving starts with: the config's, or the durable state's
	snap := f.Snapshot()
	for _, e := range snap.Engines {
		if e.Role == fleet.Prefill {
			p++
		} else {
			d++
		}
	}
	log.Info("narwhal serving", "version", version, "admin", s.adminLn.Addr().String(),
		"extproc", s.extprocLn.Addr().String(), "xds", s.xdsLn.Addr().String(), "health", addrOf(s.healthLn), "engines", len(snap.Engines), "prefill", p, "decode", d,
		"discovery_file", cfg.Discovery.File.Path, "discovery_kubernetes", cfg.Discovery.Kubernetes.Namespace,
		"tls", s.tls.Summary(), "state_dir", stateDirOf(cfg, s.rep))
	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace_s", cfg.ShutdownGraceS)
		return nil
	case err := <-s.errc:
		log.Error("shutting down", "err", err)
		return err
	}
}

// lead starts the leader's loops: the health monitor, the role controller, the switcher of
// in-place role switches, the state writer and the discovery sources. A single instance leads
// from the start; a replica once it wins the election.
func (s *server) lead() {
	runCtx := s.runCtx
	s.wg.Go(func() { _ = s.monitor.Run(runCtx) })
	s.wg.Go(func() { _ = s.roles.Run(runCtx) })
	s.wg.Go(func() { s.switcher.Run(runCtx) })
	s.wg.Go(func() { s.engineMetrics.Run(runCtx) })
	s.wg.Go(func() { s.persist.Run(runCtx, s.roles.Durable) }) // its last write follows the drain
	if s.files != nil {
		s.wg.Go(func() {
			if err := s.files.Run(runCtx); err != nil {
				s.fail(err)
			}
		})
	}
	if s.kube != nil {
		s.wg.Go(func() {
			if err := s.kube.Run(runCtx); err != nil {
				s.fail(err)
			}
		})
	}
	s.persist.Kick() // the first start writes the config's state at once
	setServing(s.health, healthpb.HealthCheckResponse_SERVING)
	s.adm.SetReady(true)
}

// take restores the state a replica takes over with (nil: none yet).
func (s *server) take(file *state.File) {
	defer func() { s.dlog.Snapshot(time.Now(), s.f.Snapshot()) }() // the roles this leader starts from
	if file == nil {
		return
	}
	if err := file.Apply(s.cfg, s.f, s.rep.Where(), s.log); err != nil {
		s.log.Error("ha: the state does not restore", "err", err)
		return
	}
	s.restore(file)
}

// restore puts back what a durable state holds beside the fleet's part (file.Apply): the router's
// profile corrections and the controller's guards. A single instance does it at its start, a
// replica when it takes over (take); nil restores nothing.
func (s *server) restore(file *state.File) {
	if file == nil {
		return
	}
	s.live.Do(func(_ time.Time, r *router.Router) { r.RestoreCorrections(file.Corrections()) })
	s.roles.Restore(file.Controller)
}

// writeFailed is told every state write that failed: a replica whose write was fenced off no
// longer leads, and ends.
func (s *server) writeFailed(err error) {
	if s.rep != nil && errors.Is(err, ha.ErrNotLeader) {
		s.fail(fmt.Errorf("ha: a state write was fenced off (%w); exiting so that this replica restarts as a standby", err))
	}
}

// shutdown drains within shutdown_grace_s and stops everything; runErr is run's failure.
func (s *server) shutdown(runErr error) error {
	cfg, log := s.cfg, s.log
	s.adm.SetReady(false)
	s.health.Shutdown() // NOT_SERVING: Envoy's health check sees the drain
	grace, cancelGrace := context.WithTimeout(context.Background(), config.Seconds(cfg.ShutdownGraceS))
	defer cancelGrace()
	// Stop admitting (new ext_proc streams are refused); let residents finish, and waiting
	// requests be placed, within the grace. Then every request still waiting is answered 503
	// shutting_down before the server stops.
	stopped := make(chan struct{})
	go func() { s.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-grace.Done():
		s.live.Shutdown()
		answers, cancelAnswers := context.WithTimeout(context.Background(), answerGrace)
		if err := s.ext.AwaitAnswers(answers); err != nil {
			log.Warn("requests left without an answer at shutdown", "err", err)
		}
		cancelAnswers()
		// grpc-go queues replies and has no flush: Stop drops what its writers hold, while the
		// graceful stop writes every stream's last frames before it closes a connection. With no
		// stream left but the answered ones (they end with their reply), it completes by itself;
		// streams still open (residents past the grace) are cut after flushPause.
		flush := time.NewTimer(flushPause)
		select {
		case <-stopped:
		case <-flush.C:
			s.grpcSrv.Stop()
			<-stopped
		}
		flush.Stop()
	}
	s.xdsSrv.Stop() // ADS streams never end by themselves; Envoy keeps its last config
	if s.healthSrv != nil {
		s.healthSrv.Stop() // it has said NOT_SERVING since the shutdown began
	}
	if err := s.adminSrv.Shutdown(grace); err != nil {
		_ = s.adminSrv.Close()
	}
	s.cancel()
	s.wg.Wait()
	if runErr != nil {
		return failureErr(runErr)
	}
	log.Info("stopped")
	return nil
}

// answerGrace bounds how long, once the shutdown grace is over, Narwhal waits for the 503
// replies of the requests it turned away to be sent.
const answerGrace = 2 * time.Second

// flushPause is how long, once the turned-away requests have their replies, Narwhal lets the
// graceful stop write them before it closes the ext_proc connections that still carry streams.
const flushPause = 200 * time.Millisecond

// eject marks an engine that passive health checking took out of placement as failed; the
// health probes readmit it.
func eject(f *fleet.Fleet, e router.Ejection, log *slog.Logger) {
	if _, err := f.Eject(e.Engine, e.Failures, time.Now()); err != nil {
		log.Warn("passive health ejection not applied", "engine", e.Engine, "err", err)
		return
	}
	log.Warn("engine ejected by passive health checking", "engine", e.Engine, "failures", e.Failures)
}

// stateDirOf is the start line's state_dir: the absolute directory of a single instance's state,
// or where replicas share theirs.
func stateDirOf(cfg *config.Config, rep *ha.Replica) string {
	if rep != nil {
		return rep.Where()
	}
	return cfg.State.Dir
}

// listenAll opens every listener the config names before anything runs: admin, ext_proc, xDS,
// and the gRPC health port when set. A port in use is one clear line and exit 1.
func listenAll(cfg *config.Config) ([]net.Listener, error) {
	var lns []net.Listener
	for _, l := range []struct{ key, addr string }{
		{"listen.admin", cfg.Listen.Admin},
		{"listen.extproc", cfg.Listen.ExtProc},
		{"listen.xds", cfg.Listen.XDS},
		{"listen.health", cfg.Listen.Health},
	} {
		if l.addr == "" {
			continue // listen.health off
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			closeAll(lns)
			return nil, failureErr(fmt.Errorf("%s %s: %w", l.key, l.addr, unwrapOp(err)))
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// The gRPC health service names besides "": GIE's picker charts probe liveness and readiness
// (with leader election) or inference-extension.
const healthLiveness = "liveness"

var healthReadiness = []string{"", "readiness", "inference-extension"}

// setServing sets the leader's status: every name but liveness.
func setServing(h *grpchealth.Server, st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range healthReadiness {
		h.SetServingStatus(name, st)
	}
}

// addrOf is a listener's address, "" for none.
func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

func closeAll(lns []net.Listener) {
	for _, ln := range lns {
		_ = ln.Close()
	}
}

// unwrapOp drops net.OpError's repetition of the address: "bind: address already in use".
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}
