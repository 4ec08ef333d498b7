package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/narwhal-llm/narwhal/admin"
	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/ha"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/state"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

// haNode is a replica's membership in a store the replicas share: etcd (ha.Node) or the
// Kubernetes API server (ha.LeaseNode).
type haNode interface {
	Campaign(ctx context.Context) error
	Resign(ctx context.Context) error
	Lost() <-chan struct{}
	Leader(ctx context.Context) (string, error)
	Save(ctx context.Context, data []byte) (int64, error)
	Load(ctx context.Context) ([]byte, int64, error)
	Watch(ctx context.Context, rev int64) <-chan []byte
	Close() error
}

// replica is this process's place among Narwhal replicas (docs/ha.md).
type replica struct {
	node  haNode
	id    string
	where string // the state's place, for messages: "etcd /narwhal/state", "configmap ns/narwhal-state"
	store string // "etcd" or "the API server"
	log   *slog.Logger

	mu       sync.Mutex
	leading  bool
	revision int64
	lastErr  error // of the last state write

	// saveMu orders the state writes of this replica: the state writer's and each decision's
	// (Persist) run concurrently, and a state captured before a decision must not land after it
	// (it would take the decision's sequence number back, and a successor would number a
	// decision again). newest is the capture time of the last state written.
	saveMu sync.Mutex
	newest time.Time

	leader    prometheus.Gauge
	elections prometheus.Counter
}

// dialReplica joins the replicas of cfg as replica id: on the Kubernetes API server
// (ha.kubernetes) or on etcd.
func dialReplica(cfg *config.Config, id string, log *slog.Logger) (*replica, error) {
	r := &replica{id: id, log: log,
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "narwhal_ha_leader", Help: "1 while this replica leads, 0 while it stands by."}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{Name: "narwhal_ha_elections_won_total",
			Help: "Elections this replica won (each one a takeover, the first start's included)."}),
	}
	if k := cfg.HA.Kubernetes; k.Namespace != "" {
		rc, err := kubeClientConfig(k.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("ha.kubernetes: %w", err)
		}
		rc.UserAgent = "narwhal/" + version
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("ha.kubernetes: %w", err)
		}
		r.node = ha.NewLeaseNode(ha.LeaseOptions{Client: cs, Namespace: k.Namespace, Name: k.Name, LeaseTTLS: cfg.HA.LeaseTTLS, ID: id, Logger: log})
		r.where, r.store = "configmap "+k.Namespace+"/"+k.Name+"-state", "the API server"
		return r, nil
	}
	n, err := dialEtcd(cfg, id, log)
	if err != nil {
		return nil, err
	}
	r.node, r.where, r.store = n, "etcd "+cfg.HA.Etcd.Prefix+"/state", "etcd"
	return r, nil
}

// dialEtcd connects to etcd as replica id.
func dialEtcd(cfg *config.Config, id string, log *slog.Logger) (*ha.Node, error) {
	tc, err := etcdTLS(cfg.HA.Etcd.TLS)
	if err != nil {
		return nil, err
	}
	// The session lives as long as the process (resign closes it), not as long as serve's
	// context: a SIGTERM must not end the lease before the drain is done and the leadership
	// handed over.
	return ha.Dial(context.Background(), ha.Options{Endpoints: cfg.HA.Etcd.Endpoints, Prefix: cfg.HA.Etcd.Prefix,
		LeaseTTLS: cfg.HA.LeaseTTLS, TLS: tc, ID: id, Logger: log})
}

func etcdTLS(t config.EtcdTLS) (*tls.Config, error) {
	if t == (config.EtcdTLS{}) {
		return nil, nil
	}
	return tlsfiles.Client("ha.etcd.tls", t.CAFile, t.CertFile, t.KeyFile)
}

func (r *replica) register(reg prometheus.Registerer) { reg.MustRegister(r.leader, r.elections) }

func (r *replica) setRevision(rev int64) {
	r.mu.Lock()
	r.revision = max(r.revision, rev)
	r.mu.Unlock()
}

// State is /narwhal/state's "ha".
func (r *replica) State() admin.HAState {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	leader, _ := r.node.Leader(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	role := "standby"
	if r.leading {
		role = "leader"
	}
	h := admin.HAState{Role: role, ID: r.id, Leader: leader, Revision: r.revision}
	if r.lastErr != nil {
		h.StateError = r.lastErr.Error()
	}
	return h
}

// load reads the state from etcd (nil without one).
func (r *replica) load(ctx context.Context) (*state.File, error) {
	data, rev, err := r.node.Load(ctx)
	if err != nil {
		return nil, err
	}
	r.setRevision(rev)
	if data == nil {
		return nil, nil
	}
	return state.Decode(data, r.where)
}

// saveTimeout bounds one state write to etcd: a role move waits for its write (under the
// controller's lock), so an unreachable etcd must fail it quickly.
const saveTimeout = 2 * time.Second

// save writes the state, fenced by this replica's leadership. A state captured before the last
// one written is stale: it is not written (nil: what it holds is already durable, and newer).
func (r *replica) save(f *state.File) error {
	r.saveMu.Lock()
	defer r.saveMu.Unlock()
	if f.Written.Before(r.newest) {
		return nil
	}
	data, err := state.Encode(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), saveTimeout)
	defer cancel()
	rev, err := r.node.Save(ctx, data)
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
	if err == nil {
		r.setRevision(rev)
		r.newest = f.Written
	}
	return err
}

// persistDecision is the controller's Persist for a replica: the state with the decision (its
// sequence number, its moves already made), written (fenced) before the fleet applies it and
// the log shows it — so a successor neither loses a move nor numbers a decision again.
func (r *replica) persistDecision(f *fleet.Fleet, loads func() []router.EngineLoad) func(*decisionlog.Decision, controller.Durable) error {
	return func(d *decisionlog.Decision, c controller.Durable) error {
		now := time.Now()
		snap := f.Snapshot()
		for _, m := range d.Moves {
			role, err := fleet.ParseRole(m.To)
			if err != nil {
				return err
			}
			// A move the fleet will refuse is not in the state: ApplyDecision records it refused.
			_ = snap.Move(m.Engine, role, now, d.Seq)
		}
		return r.save(state.Capture(snap, c, loads(), now))
	}
}

// follow applies every state the leader writes to the fleet (roles, lifecycles, pins, holds),
// so that this standby's xDS serves the same roles, until ctx ends.
func (r *replica) follow(ctx context.Context, f *fleet.Fleet, from int64) {
	for data := range r.node.Watch(ctx, from) {
		file, err := state.Decode(data, r.where)
		if err != nil {
			r.log.Error("standby: the leader's state does not decode", "err", err)
			continue
		}
		engines, _ := file.Fleet()
		if _, err := f.Restore(engines); err != nil {
			r.log.Error("standby: the leader's state does not apply", "err", err)
		}
	}
}

// lead stands by until this replica wins the election, then takes the latest state and calls
// start (the leader's loops). It returns when ctx ends; lost reports what ends this replica: a
// leadership lost after winning (the lease ended: another replica may lead now).
func (r *replica) lead(ctx context.Context, f *fleet.Fleet, take func(*state.File), start func(), lost func(error)) {
	fctx, stopFollow := context.WithCancel(ctx)
	r.mu.Lock()
	from := r.revision
	r.mu.Unlock()
	go r.follow(fctx, f, from)
	r.log.Info("ha: standing by", "id", r.id)
	err := r.node.Campaign(ctx)
	stopFollow()
	if err != nil {
		return // ctx ended
	}
	file, err := r.load(ctx)
	if err != nil {
		lost(fmt.Errorf("ha: elected but the state does not load: %w", err))
		return
	}
	take(file)
	r.mu.Lock()
	r.leading = true
	r.mu.Unlock()
	r.leader.Set(1)
	r.elections.Inc()
	r.log.Info("ha: leading", "id", r.id, "state_revision", r.revision)
	start()
	select {
	case <-r.node.Lost():
	case <-ctx.Done():
		return
	}
	// The lease ended. If the store answers, another replica may lead now: step down (exit, so
	// that the supervisor restarts this one as a standby). If it does not answer, no replica can
	// take over either: keep routing with the roles this one has — its state writes fail, so
	// it makes no role move — and say so, until it answers again.
	for {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := r.node.Leader(qctx)
		cancel()
		if err == nil {
			lost(fmt.Errorf("ha: the leadership was lost (the lease on %s ended); exiting so that this replica restarts as a standby", r.store))
			return
		}
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		r.lastErr = fmt.Errorf("%s unreachable, the lease lost: routing with the roles held, no role moves (%v)", r.store, err)
		r.mu.Unlock()
		r.log.Warn("ha: the store is unreachable after the lease ended: keeping the roles, making no role move", "store", r.store, "err", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
	}
}

// resign hands the leadership over (a standby takes over at once) and closes the session.
func (r *replica) resign() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.mu.Lock()
	leading := r.leading
	r.leading = false
	r.mu.Unlock()
	if leading {
		if err := r.node.Resign(ctx); err != nil {
			r.log.Warn("ha: resign", "err", err)
		}
		r.leader.Set(0)
	}
	_ = r.node.Close()
}
