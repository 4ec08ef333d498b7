// Package ha lets several Narwhal replicas share one fleet through etcd (docs/ha.md): they elect
// one leader with etcd's own election (go.etcd.io/etcd/client/v3/concurrency), and the durable
// state lives in etcd, written only in transactions fenced by the leader's election key — a
// replica that lost its lease (deposed, paused past it, partitioned) cannot write, and learns so
// from the failed write. Every replica reads the state, so each serves xDS from the same roles.
package ha

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Options configure a replica's connection to etcd (config ha.*).
type Options struct {
	Endpoints   []string
	Prefix      string      // the keys' prefix (ha.etcd.prefix): <prefix>/leader, <prefix>/state
	LeaseTTLS   int         // the election lease's TTL in seconds (ha.lease_ttl_s)
	TLS         *tls.Config // nil: plain connections
	ID          string      // this replica's id, published as the leader's value
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// ErrNotLeader is a fenced write refused: this replica does not hold the leadership it
// campaigned for (its lease expired, or it resigned). A leader that sees it steps down.
var ErrNotLeader = errors.New("ha: not the leader: the state write was fenced off")

// Node is one replica's membership: an etcd client, a lease-backed session and the election.
type Node struct {
	cli   *clientv3.Client
	sess  *concurrency.Session
	elect *concurrency.Election
	o     Options

	mu  sync.Mutex
	key string // the election key this replica created when it won ("" while it does not lead)
	rev int64  // its creation revision: the fence of every state write
}

// Dial connects to etcd and opens the replica's session (its lease).
func Dial(ctx context.Context, o Options) (*Node, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: o.Endpoints, DialTimeout: o.DialTimeout, TLS: o.TLS, Context: ctx, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("ha: etcd %v: %w", o.Endpoints, err)
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(o.LeaseTTLS), concurrency.WithContext(ctx))
	if err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("ha: etcd %v: opening a session: %w", o.Endpoints, err)
	}
	return &Node{cli: cli, sess: sess, elect: concurrency.NewElection(sess, path.Join(o.Prefix, "leader")), o: o}, nil
}

// Close ends the session (its lease is revoked: leadership, if held, passes at once) and the
// client.
func (n *Node) Close() error {
	err := n.sess.Close()
	if cerr := n.cli.Close(); err == nil {
		err = cerr
	}
	return err
}

// Campaign blocks until this replica leads, or ctx ends.
func (n *Node) Campaign(ctx context.Context) error {
	if err := n.elect.Campaign(ctx, n.o.ID); err != nil {
		return err
	}
	n.mu.Lock()
	n.key, n.rev = n.elect.Key(), n.elect.Rev()
	n.mu.Unlock()
	return nil
}

// Resign gives the leadership up (a standby takes over at once); later writes are refused.
func (n *Node) Resign(ctx context.Context) error {
	n.mu.Lock()
	n.key, n.rev = "", 0
	n.mu.Unlock()
	return n.elect.Resign(ctx)
}

// Lost is closed when the session's lease is gone (expired or revoked): a leader must stop
// acting as one.
func (n *Node) Lost() <-chan struct{} { return n.sess.Done() }

// Leader returns the current leader's id, or "" when there is none.
func (n *Node) Leader(ctx context.Context) (string, error) {
	resp, err := n.elect.Leader(ctx)
	if errors.Is(err, concurrency.ErrElectionNoLeader) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return string(resp.Kvs[0].Value), nil
}

func (n *Node) stateKey() string { return path.Join(n.o.Prefix, "state") }

// Save writes the state in one transaction that succeeds only while this replica's election
// key is the one it created when it won (fencing); it returns the state's new revision, or
// ErrNotLeader.
func (n *Node) Save(ctx context.Context, data []byte) (int64, error) {
	n.mu.Lock()
	key, rev := n.key, n.rev
	n.mu.Unlock()
	if key == "" {
		return 0, ErrNotLeader
	}
	resp, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
		Then(clientv3.OpPut(n.stateKey(), string(data))).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("ha: writing the state: %w", err)
	}
	if !resp.Succeeded {
		return 0, ErrNotLeader
	}
	return resp.Header.Revision, nil
}

// Load reads the state and its revision; nil data when none was written yet.
func (n *Node) Load(ctx context.Context) ([]byte, int64, error) {
	resp, err := n.cli.Get(ctx, n.stateKey())
	if err != nil {
		return nil, 0, fmt.Errorf("ha: reading the state: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// Watch sends every new state written after revision rev (a standby follows the leader's
// writes) until ctx ends.
func (n *Node) Watch(ctx context.Context, rev int64) <-chan []byte {
	out := make(chan []byte, 1)
	go func() {
		defer close(out)
		for wr := range n.cli.Watch(ctx, n.stateKey(), clientv3.WithRev(rev+1)) {
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				select {
				case out <- ev.Kv.Value:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
