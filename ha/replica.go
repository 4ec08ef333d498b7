package ha

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/admin"
	"github.com/narwhal-llm/narwhal/controller"
	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
	"github.com/narwhal-llm/narwhal/state"
)

// Member is a replica's membership in a store the replicas share: etcd (Node) or the
// Kubernetes API server (LeaseNode).
type Member interface {
	Campaign(ctx context.Context) error
	Resign(ctx context.Context) error
	Lost() <-chan struct{}
	Leader(ctx context.Context) (string, error)
	Save(ctx context.Context, data []byte) (int64, error)
	Load(ctx context.Context) ([]byte, int64, error)
	Watch(ctx context.Context, rev int64) <-chan []byte
	Close() error
}

// Replica is this process's place among Narwhal replicas (docs/ha.md): it stands by following
// the leader's state, takes over when elected, writes the state fenced by its leadership and
// hands the leadership over when it stops.
type Replica struct {
	node  Member
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

// NewReplica is replica id on node; where names the state's place in messages ("etcd
// /narwhal/state", "configmap ns/narwhal-state") and store the store ("etcd", "the API
// server").
func NewReplica(node Member, id, where, store string, log *slog.Logger) *Replica {
	return &Replica{node: node, id: id, where: where, store: store, log: log,
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "narwhal_ha_leader", Help: "1 while this replica leads, 0 while it stands by."}),
		elections: prometheus.NewCounter(prometheus.CounterOpts{Name: "narwhal_ha_elections_won_total",
			Help: "Elections this replica won (each one a takeover, the first start's included)."}),
	}
}

// Where names the state's place, for messages.
func (r *Replica) Where() string { return r.where }

// Register registers the replica's metrics.
func (r *Replica) Register(reg prometheus.Registerer) { reg.MustRegister(r.leader, r.elections) }

func (r *Replica) setRevision(rev int64) {
	r.mu.Lock()
	r.revision = max(r.revision, rev)
	r.mu.Unlock()
}

// State is /narwhal/state's "ha".
func (r *Replica) State() admin.HAState {
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

// Load reads the state from the store (nil without one).
func (r *Replica) Load(ctx context.Context) (*state.File, error) {
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

// Save writes the state, fenced by this replica's leadership. A state captured before the last
// one written is stale: it is not written (nil: what it holds is already durable, and newer).
func (r *Replica) Save(f *state.File) error {
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

// PersistDecision is the controller's Persist for a replica: the state with the decision (its
// sequence number, its moves already made), written (fenced) before the fleet applies it and
// the log shows it — so a successor neither loses a move nor numbers a decision again.
func (r *Replica) PersistDecision(f *fleet.Fleet, loads func() []router.EngineLoad) func(*decisionlog.Decision, controller.Durable) error {
	return func(d *decisionlog.Decision, c controller.Durable) error {
		now := time.Now()
		snap := f.Snapshot()
		for _, m := range d.Moves {
			// A move the fleet will refuse is not in the state: ApplyDecision records it refused.
			_ = snap.Move(m.Engine, m.To, now, d.Seq)
		}
		return r.Save(state.Capture(snap, c, loads(), now))
	}
}

// follow applies every state the leader writes to the fleet (roles, lifecycles, pins, holds),
// so that this standby's xDS serves the same roles, until ctx ends.
func (r *Replica) follow(ctx context.Context, f *fleet.Fleet, from int64) {
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

// Lead stands by until this replica wins the election, then takes the latest state and calls
// start (the leader's loops). It returns when ctx ends; lost reports what ends this replica: a
// leadership lost after winning (the lease ended: another replica may lead now).
func (r *Replica) Lead(ctx context.Context, f *fleet.Fleet, take func(*state.File), start func(), lost func(error)) {
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
	file, err := r.Load(ctx)
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

// Resign hands the leadership over (a standby takes over at once) and closes the session.
func (r *Replica) Resign() {
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
