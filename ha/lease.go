package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// LeaseOptions configure a replica on the Kubernetes API server (config ha.kubernetes): the
// leader holds a coordination.k8s.io Lease NAME, and the durable state is the ConfigMap
// NAME-state, both in Namespace.
type LeaseOptions struct {
	// Leases reads and writes the Lease, State the state ConfigMap: two clients, each with its
	// own client-side rate limit (client-go's default, 5 requests a second, which the typed
	// clientset gave each API group), so that a run of state writes never holds up the Lease's
	// renewal.
	Leases    dynamic.Interface
	State     dynamic.Interface
	Namespace string
	Name      string
	LeaseTTLS int    // the Lease's duration: a dead leader is replaced within it
	ID        string // this replica's id: the Lease's holderIdentity
	Logger    *slog.Logger
	Now       func() time.Time
}

// Keys of the state ConfigMap.
const (
	stateDataKey = "state"
	// epochAnnotation is the leader epoch (the Lease's leaseTransitions when its writer won)
	// of the state's last write: a write of an older epoch is refused.
	epochAnnotation = "narwhal.dev/leader-epoch"
)

// LeaseNode is one replica's membership on the API server: the Lease election and the state
// ConfigMap, written with optimistic concurrency and fenced by the leader epoch.
type LeaseNode struct {
	o LeaseOptions

	mu     sync.Mutex
	epoch  int32 // the Lease's leaseTransitions when this replica won (0: it does not lead)
	lost   chan struct{}
	stop   context.CancelFunc // the renewal loop's
	closed bool
}

// NewLeaseNode returns the replica's node; nothing is written until it campaigns.
func NewLeaseNode(o LeaseOptions) *LeaseNode {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &LeaseNode{o: o, lost: make(chan struct{})}
}

func (n *LeaseNode) ttl() time.Duration { return time.Duration(n.o.LeaseTTLS) * time.Second }

func (n *LeaseNode) leases() typed[coordinationv1.Lease] {
	return typed[coordinationv1.Lease]{n.o.Leases.Resource(coordinationv1.SchemeGroupVersion.WithResource("leases")).Namespace(n.o.Namespace),
		coordinationv1.SchemeGroupVersion.WithKind("Lease")}
}

func (n *LeaseNode) configMaps() typed[corev1.ConfigMap] {
	return typed[corev1.ConfigMap]{n.o.State.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(n.o.Namespace),
		corev1.SchemeGroupVersion.WithKind("ConfigMap")}
}

// typed reads and writes a resource of the dynamic client as its k8s.io/api struct T, converted
// from and to unstructured; the typed clientset would link every API group's client into the
// binary (docs/kubernetes.md, "Which pods are engines"). The API server's errors (a conflict,
// a refusal) come back as they are.
type typed[T any] struct {
	r   dynamic.ResourceInterface
	gvk schema.GroupVersionKind // set on what is sent, as the typed clientset does
}

func (c typed[T]) Get(ctx context.Context, name string, o metav1.GetOptions) (*T, error) {
	return fromUnstructured[T](c.r.Get(ctx, name, o))
}

func (c typed[T]) Create(ctx context.Context, obj *T, o metav1.CreateOptions) (*T, error) {
	u, err := c.unstructured(obj)
	if err != nil {
		return nil, err
	}
	return fromUnstructured[T](c.r.Create(ctx, u, o))
}

func (c typed[T]) Update(ctx context.Context, obj *T, o metav1.UpdateOptions) (*T, error) {
	u, err := c.unstructured(obj)
	if err != nil {
		return nil, err
	}
	return fromUnstructured[T](c.r.Update(ctx, u, o))
}

func (c typed[T]) unstructured(obj *T) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, fmt.Errorf("ha: %s: %w", c.gvk.Kind, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(c.gvk)
	return u, nil
}

// fromUnstructured is u as a T, or err.
func fromUnstructured[T any](u *unstructured.Unstructured, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	obj := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return nil, fmt.Errorf("ha: %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return obj, nil
}

// expired reports whether a Lease's holder has not renewed it within its duration.
func (n *LeaseNode) expired(l *coordinationv1.Lease) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return true
	}
	d := n.ttl()
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return n.o.Now().After(l.Spec.RenewTime.Add(d))
}

// Campaign blocks until this replica holds the Lease, or ctx ends. It tries every quarter of
// the Lease's duration; a Lease released (Resign) or expired is taken at the next try.
func (n *LeaseNode) Campaign(ctx context.Context) error {
	for {
		ok, err := n.tryAcquire(ctx)
		if err != nil && ctx.Err() == nil {
			n.o.Logger.Warn("ha: campaign: the Lease could not be read or taken; trying again", "err", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(n.ttl() / 4):
		}
	}
}

func (n *LeaseNode) tryAcquire(ctx context.Context) (bool, error) {
	now := metav1.NewMicroTime(n.o.Now())
	dur := int32(n.o.LeaseTTLS)
	id := n.o.ID
	l, err := n.leases().Get(ctx, n.o.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		one := int32(1)
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.o.Name, Namespace: n.o.Namespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now, LeaseTransitions: &one}}
		if l, err = n.leases().Create(ctx, l, metav1.CreateOptions{}); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return false, nil
			}
			return false, err
		}
	case err != nil:
		return false, err
	case !n.expired(l) && *l.Spec.HolderIdentity != id:
		return false, nil
	default:
		transitions := int32(0)
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions
		}
		transitions++
		l.Spec = coordinationv1.LeaseSpec{HolderIdentity: &id, LeaseDurationSeconds: &dur, AcquireTime: &now, RenewTime: &now, LeaseTransitions: &transitions}
		if l, err = n.leases().Update(ctx, l, metav1.UpdateOptions{}); err != nil { // refused if another replica got there first
			if apierrors.IsConflict(err) {
				return false, nil
			}
			return false, err
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	n.mu.Lock()
	n.epoch, n.stop = *l.Spec.LeaseTransitions, cancel
	n.mu.Unlock()
	go n.renew(rctx)
	return true, nil
}

// renew renews the Lease every third of its duration, each attempt bounded by a third of it.
// When it has not renewed for two thirds of it (the API server away or slow, another replica
// holding it), it stops leading — a third of the duration before another replica may take the
// Lease: Lost closes, and no state write passes the fence from then on.
func (n *LeaseNode) renew(ctx context.Context) {
	last := n.o.Now() // the renew time of the last successful renewal
	deadline := 2 * n.ttl() / 3
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.ttl() / 3):
		}
		if n.o.Now().Sub(last) > deadline {
			n.depose(fmt.Sprintf("the Lease was not renewed for %v", n.o.Now().Sub(last).Round(time.Millisecond)))
			return
		}
		stamp := n.o.Now()
		actx, cancel := context.WithTimeout(ctx, n.ttl()/3)
		err := n.renewOnce(actx, stamp)
		cancel()
		switch {
		case err == nil:
			last = stamp
		case errors.Is(err, ErrNotLeader):
			n.depose("another replica holds the Lease")
			return
		case ctx.Err() != nil:
			return
		case n.o.Now().Sub(last) > deadline:
			n.depose(fmt.Sprintf("the Lease was not renewed for %v: %v", n.o.Now().Sub(last).Round(time.Millisecond), err))
			return
		}
	}
}

// renewOnce stamps the Lease with renew time stamp, if it is still this replica's.
func (n *LeaseNode) renewOnce(ctx context.Context, stamp time.Time) error {
	cur, err := n.leases().Get(ctx, n.o.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !n.holds(cur) {
		return ErrNotLeader
	}
	t := metav1.NewMicroTime(stamp)
	cur.Spec.RenewTime = &t
	_, err = n.leases().Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// holds reports whether l is this replica's Lease of the epoch it won.
func (n *LeaseNode) holds(l *coordinationv1.Lease) bool {
	n.mu.Lock()
	epoch := n.epoch
	n.mu.Unlock()
	return epoch != 0 && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == n.o.ID &&
		l.Spec.LeaseTransitions != nil && *l.Spec.LeaseTransitions == epoch
}

func (n *LeaseNode) depose(why string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.epoch == 0 {
		return
	}
	n.o.Logger.Error("ha: leadership lost", "why", why)
	n.epoch = 0
	if !n.closed {
		n.closed = true
		close(n.lost)
	}
}

// Resign releases the Lease (a standby takes it at its next try); later writes are refused.
func (n *LeaseNode) Resign(ctx context.Context) error {
	n.mu.Lock()
	epoch, stop := n.epoch, n.stop
	n.epoch = 0
	n.mu.Unlock()
	if stop != nil {
		stop()
	}
	if epoch == 0 {
		return nil
	}
	l, err := n.leases().Get(ctx, n.o.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != n.o.ID || l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions != epoch {
		return nil
	}
	empty := ""
	l.Spec.HolderIdentity, l.Spec.RenewTime = &empty, nil
	_, err = n.leases().Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// Lost is closed when this replica stops leading without resigning.
func (n *LeaseNode) Lost() <-chan struct{} { return n.lost }

// Leader returns the current leader's id, or "" when the Lease is free or expired.
func (n *LeaseNode) Leader(ctx context.Context) (string, error) {
	l, err := n.leases().Get(ctx, n.o.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if n.expired(l) {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// Close resigns.
func (n *LeaseNode) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return n.Resign(ctx)
}

func (n *LeaseNode) stateName() string { return n.o.Name + "-state" }

// Save writes the state while this replica leads: the Lease read afresh must be its own of
// the epoch it won, the ConfigMap's last write must be of no later epoch, and the update names
// the ConfigMap's resourceVersion (a write in between refuses it: optimistic concurrency).
// It returns the state's new revision, or ErrNotLeader.
func (n *LeaseNode) Save(ctx context.Context, data []byte) (int64, error) {
	n.mu.Lock()
	epoch := n.epoch
	n.mu.Unlock()
	if epoch == 0 {
		return 0, ErrNotLeader
	}
	for range 3 { // a conflict with our own earlier write in flight: read again
		l, err := n.leases().Get(ctx, n.o.Name, metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("ha: reading the Lease: %w", err)
		}
		if !n.holds(l) || n.expired(l) {
			return 0, ErrNotLeader
		}
		cms := n.configMaps()
		cm, err := cms.Get(ctx, n.stateName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n.stateName(), Namespace: n.o.Namespace}}
			cm.Annotations = map[string]string{epochAnnotation: strconv.Itoa(int(epoch))}
			cm.Data = map[string]string{stateDataKey: string(data)}
			if cm, err = cms.Create(ctx, cm, metav1.CreateOptions{}); err == nil {
				return revision(cm), nil
			}
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			return 0, fmt.Errorf("ha: writing the state: %w", err)
		}
		if err != nil {
			return 0, fmt.Errorf("ha: reading the state: %w", err)
		}
		if e, _ := strconv.Atoi(cm.Annotations[epochAnnotation]); int32(e) > epoch {
			return 0, ErrNotLeader // a later leader has written
		}
		if cm.Annotations == nil {
			cm.Annotations = map[string]string{}
		}
		cm.Annotations[epochAnnotation] = strconv.Itoa(int(epoch))
		cm.Data = map[string]string{stateDataKey: string(data)}
		cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return revision(cm), nil
		case apierrors.IsConflict(err):
			continue
		default:
			return 0, fmt.Errorf("ha: writing the state: %w", err)
		}
	}
	return 0, ErrNotLeader
}

// revision is an object's resourceVersion as a number: opaque to clients by the API's
// contract, it is etcd's revision on every API server there is; Narwhal only shows it and
// watches from it.
func revision(cm *corev1.ConfigMap) int64 {
	rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
	return rv
}

// Load reads the state and its revision; nil data when none was written yet.
func (n *LeaseNode) Load(ctx context.Context) ([]byte, int64, error) {
	cm, err := n.configMaps().Get(ctx, n.stateName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("ha: reading the state: %w", err)
	}
	return []byte(cm.Data[stateDataKey]), revision(cm), nil
}

// Watch sends every state written after revision rev until ctx ends, watching again after a
// watch ends.
func (n *LeaseNode) Watch(ctx context.Context, rev int64) <-chan []byte {
	out := make(chan []byte, 1)
	go func() {
		defer close(out)
		from := strconv.FormatInt(rev, 10)
		for ctx.Err() == nil {
			w, err := n.configMaps().r.Watch(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("metadata.name", n.stateName()).String(), ResourceVersion: from})
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			for ev := range w.ResultChan() {
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					if st, isStatus := ev.Object.(*metav1.Status); isStatus && st.Code == 410 {
						from = "" // too old: from now on
					}
					continue
				}
				cm, err := fromUnstructured[corev1.ConfigMap](u, nil)
				if err != nil {
					continue // not a ConfigMap: no state in it
				}
				from = cm.ResourceVersion
				select {
				case out <- []byte(cm.Data[stateDataKey]):
				case <-ctx.Done():
					w.Stop()
					return
				}
			}
		}
	}()
	return out
}
