package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
)

// SourceKubernetes is the fleet.Engine.Source of the engines Kubernetes pods are.
const SourceKubernetes = "kubernetes"

// InferencePoolResource is the Gateway API Inference Extension's InferencePool.
var InferencePoolResource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

var podResource = corev1.SchemeGroupVersion.WithResource("pods")

// Members picks the pods that are engines and their engine ports: a label selector and ports,
// from the config or from an InferencePool.
type Members struct {
	Selector labels.Selector
	Ports    []int
}

// PodEndpoints are the engines a pod is: none unless it is Running and Ready, not terminating,
// with an IP; else one per port, named after the pod (and the port, when there are several),
// carrying the pod's labels.
func PodEndpoints(pod *corev1.Pod, ports []int) []Endpoint {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" || !podReady(pod) {
		return nil
	}
	out := make([]Endpoint, 0, len(ports))
	for _, port := range ports {
		name := pod.Name
		if len(ports) > 1 {
			name += "-" + strconv.Itoa(port)
		}
		out = append(out, Endpoint{Name: name, Address: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)), Labels: pod.Labels, Annotations: pod.Annotations})
	}
	return out
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PoolMembers reads an InferencePool's spec.selector.matchLabels and spec.targetPorts.
func PoolMembers(pool *unstructured.Unstructured) (Members, error) {
	match, _, err := unstructured.NestedStringMap(pool.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return Members{}, fmt.Errorf("inferencepool %s: spec.selector.matchLabels: %w", pool.GetName(), err)
	}
	if len(match) == 0 {
		return Members{}, fmt.Errorf("inferencepool %s: spec.selector.matchLabels is empty", pool.GetName())
	}
	targets, _, err := unstructured.NestedSlice(pool.Object, "spec", "targetPorts")
	if err != nil {
		return Members{}, fmt.Errorf("inferencepool %s: spec.targetPorts: %w", pool.GetName(), err)
	}
	var ports []int
	for i, t := range targets {
		var n int64
		switch v := asMap(t)["number"].(type) { // int64 from the API server, float64 from a YAML or JSON file
		case int64:
			n = v
		case float64:
			n = int64(v)
		}
		if n < 1 || n > 65535 {
			return Members{}, fmt.Errorf("inferencepool %s: spec.targetPorts[%d].number: want a port, got %d", pool.GetName(), i, n)
		}
		ports = append(ports, int(n))
	}
	if len(ports) == 0 {
		return Members{}, fmt.Errorf("inferencepool %s: spec.targetPorts is empty", pool.GetName())
	}
	return Members{Selector: labels.SelectorFromSet(match), Ports: ports}, nil
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// KubernetesStatus is what /narwhal/state shows of Kubernetes discovery.
type KubernetesStatus struct {
	Namespace     string `json:"namespace"`
	Selector      string `json:"selector"`
	Ports         []int  `json:"ports"`
	InferencePool string `json:"inference_pool,omitempty"`
	// Synced: the pods have been listed once; Read is the last reconciliation and Engines the
	// engines the pods were then.
	Synced  bool      `json:"synced"`
	Read    time.Time `json:"read"`
	Engines int       `json:"engines"`
	// Unreachable says why the API server does not answer, since when: placement goes on with
	// the membership it last had. WatchError is the last error of a watch (a refused one names
	// the verbs and resource RBAC must grant), and when.
	Unreachable      string    `json:"unreachable,omitempty"`
	UnreachableSince time.Time `json:"unreachable_since"`
	WatchError       string    `json:"watch_error,omitempty"`
	WatchErrorAt     time.Time `json:"watch_error_at"`
	// Error is why the pool or the selector cannot be used; Problems the pods that could not be
	// taken as they are.
	Error    string   `json:"error,omitempty"`
	Problems []string `json:"problems,omitempty"`
	// LabelWrites and LabelErrors count role labels written back to pods (write_role_label).
	LabelWrites int64  `json:"label_writes"`
	LabelErrors int64  `json:"label_errors"`
	LabelError  string `json:"label_error,omitempty"`
	// LabelRefused counts role labels not written because the pod's owner selects on the role
	// label (the write would take the pod out of its ReplicaSet, which would start another), or
	// the owner could not be read to check; LabelRefusal says the latest, and what to do.
	LabelRefused int64  `json:"label_refused"`
	LabelRefusal string `json:"label_refusal,omitempty"`
}

// Kubernetes watches pods (and an InferencePool) with client-go informers and reconciles the
// fleet with the pods that are engines; with WriteRoleLabel it writes the controller's role
// changes back to the pods. Run it on the leader only.
//
// It reads and writes the API server's objects with the dynamic client, as the k8s.io/api
// structs converted from unstructured: client-go's typed clientset and its informers would link
// every API group's client into the binary (docs/kubernetes.md, "Which pods are engines").
type Kubernetes struct {
	Config config.DiscoveryKubernetes
	Client dynamic.Interface
	// Server asks the API server its /version, which is no resource of the dynamic client's: a
	// client of its own, whose client-side rate limit (client-go's default, 5 requests a second)
	// no burst of label writes uses up, lest the API server look unreachable while it answers.
	Server rest.Interface
	Source *Source
	Fleet  *fleet.Fleet
	// RoleLabel is the label written back (config.Discovery.RoleLabel).
	RoleLabel string
	Now       func() time.Time
	Log       *slog.Logger
	// OnRead, if set, sees the status after every reconciliation (tests); it must be quick.
	OnRead func(KubernetesStatus)

	mu      sync.Mutex
	status  KubernetesStatus
	members *Members
	pods    map[string]podRef // engine id → its pod
	kick    chan struct{}
	writes  chan roleWrite
	// owners caches, by owner UID, why writing the role label to its pods would be refused
	// ("" when it would not): a workload's selector does not change.
	owners map[types.UID]string
}

// podRef is the pod an engine is: its name, its UID (a label write names it, so that a pod
// recreated under the same name is not written), and its controlling owner.
type podRef struct {
	name  string
	uid   types.UID
	owner *metav1.OwnerReference
	label string // its role label when listed
}

type roleWrite struct {
	engine, role string
}

// Status is the watcher's status now.
func (k *Kubernetes) Status() KubernetesStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.status
	s.Problems, s.Ports = slices.Clone(s.Problems), slices.Clone(s.Ports)
	return s
}

// Run watches until ctx ends.
func (k *Kubernetes) Run(ctx context.Context) error {
	k.kick, k.writes = make(chan struct{}, 1), make(chan roleWrite, 256)
	c := k.Config
	k.mu.Lock()
	k.pods, k.owners = map[string]podRef{}, map[types.UID]string{}
	k.status = KubernetesStatus{Namespace: c.Namespace, Selector: c.Selector, Ports: c.Ports, InferencePool: c.InferencePool}
	k.mu.Unlock()
	resync := config.Seconds(c.ResyncS)
	if c.InferencePool == "" {
		sel, err := labels.Parse(c.Selector)
		if err != nil {
			return fmt.Errorf("discovery.kubernetes.selector: %w", err)
		}
		k.mu.Lock()
		k.members = &Members{Selector: sel, Ports: c.Ports}
		k.mu.Unlock()
	}
	// The pods: with a selector the API server filters; with a pool (whose selector may
	// change) every pod of the namespace is watched and filtered here. The informer keeps them
	// as Pods, each converted once as it comes rather than at every reconciliation, and says
	// *v1.Pod in its errors as the typed informer did.
	podInf := k.informer(podResource, fmt.Sprintf("%T", (*corev1.Pod)(nil)), resync, func(o *metav1.ListOptions) {
		if c.InferencePool == "" {
			o.LabelSelector = c.Selector
		}
	})
	_ = podInf.SetTransform(toPod)
	k.watch(podInf, "pods", "list and watch")
	var wg sync.WaitGroup
	defer wg.Wait()
	var poolInf cache.SharedIndexInformer
	if c.InferencePool != "" {
		poolInf = k.informer(InferencePoolResource, InferencePoolResource.String(), resync, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.InferencePool).String()
		})
		k.watch(poolInf, "inferencepools.inference.networking.k8s.io", "list and watch")
		wg.Go(func() { poolInf.RunWithContext(ctx) })
	}
	wg.Go(func() { podInf.RunWithContext(ctx) })
	wg.Go(func() { k.checkReachable(ctx) })
	if c.WriteRoleLabel {
		stop := k.followRoles()
		defer stop()
		wg.Go(func() { k.writeLabels(ctx) })
	}
	synced := []cache.InformerSynced{podInf.HasSynced}
	if poolInf != nil {
		synced = append(synced, poolInf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx ended
	}
	for {
		if poolInf != nil {
			k.readPool(poolInf)
		}
		k.reconcile(podInf.GetStore())
		select {
		case <-ctx.Done():
			return nil
		case <-k.kick:
		}
	}
}

// informer lists and watches a resource of the namespace, with tweak's list options, as
// *unstructured.Unstructured; what names it in its errors.
func (k *Kubernetes) informer(gvr schema.GroupVersionResource, what string, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	r := k.Client.Resource(gvr).Namespace(k.Config.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return r.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{ResyncPeriod: resync, ObjectDescription: what})
}

// toPod is the pod informer's transform: the Pod of a listed or watched object. Anything else
// (a deleted pod's tombstone, whose pod was converted already) passes as it is.
func toPod(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	pod := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pod); err != nil {
		return nil, fmt.Errorf("pod %s: %w", u.GetName(), err)
	}
	return pod, nil
}

// watch makes every change of an informer's objects kick a reconciliation, and its watch
// errors say what is wrong, once per error.
func (k *Kubernetes) watch(inf cache.SharedIndexInformer, resource, verbs string) {
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.poke() },
		UpdateFunc: func(any, any) { k.poke() },
		DeleteFunc: func(any) { k.poke() },
	})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // a watch that ended: the reflector lists again
		}
		msg := err.Error()
		if apierrors.IsForbidden(err) {
			msg = fmt.Sprintf("forbidden to %s %s in namespace %s: grant them to Narwhal's service account (docs/kubernetes.md, RBAC): %v", verbs, resource, k.Config.Namespace, err)
		}
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.status.WatchError != msg {
			k.Log.Error("discovery.kubernetes: watch failed; placement goes on with the last membership", "resource", resource, "err", msg)
		}
		k.status.WatchError, k.status.WatchErrorAt = msg, k.Now()
	})
}

func (k *Kubernetes) poke() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// checkReachable asks the API server its version every second (the reflectors back off
// quietly while it refuses connections): the status says when it stops answering and when it
// answers again.
func (k *Kubernetes) checkReachable(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := k.Server.Get().AbsPath("/version").DoRaw(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		switch {
		case err != nil && k.status.Unreachable == "":
			k.Log.Error("discovery.kubernetes: the API server does not answer; placement goes on with the last membership", "err", err)
			k.status.Unreachable, k.status.UnreachableSince = err.Error(), k.Now()
		case err != nil:
			k.status.Unreachable = err.Error()
		case k.status.Unreachable != "":
			k.Log.Info("discovery.kubernetes: the API server answers again", "down_s", k.Now().Sub(k.status.UnreachableSince).Seconds())
			k.status.Unreachable, k.status.UnreachableSince = "", time.Time{}
		}
		k.mu.Unlock()
	}
}

// readPool takes the InferencePool's selector and ports; a pool that is missing or unusable
// leaves the members as they were (said in the status).
func (k *Kubernetes) readPool(inf cache.SharedIndexInformer) {
	objs := inf.GetStore().List()
	var m Members
	err := fmt.Errorf("inferencepool %s/%s not found", k.Config.Namespace, k.Config.InferencePool)
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok && u.GetName() == k.Config.InferencePool {
			m, err = PoolMembers(u)
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if k.status.Error != err.Error() {
			k.Log.Error("discovery.kubernetes: the pool cannot be used; the fleet keeps its engines", "err", err)
		}
		k.status.Error = err.Error()
		return
	}
	k.status.Error = ""
	k.members = &m
	k.status.Selector, k.status.Ports = m.Selector.String(), m.Ports
}

// reconcile makes the fleet's Kubernetes engines the Ready pods' endpoints, of the pods in
// store (the pod informer's: Pods).
func (k *Kubernetes) reconcile(store cache.Store) {
	k.mu.Lock()
	m := k.members
	k.mu.Unlock()
	if m == nil {
		return // no usable pool yet
	}
	var pods []*corev1.Pod
	_ = cache.ListAll(store, m.Selector, func(o any) { pods = append(pods, o.(*corev1.Pod)) })
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	var eps []Endpoint
	names := map[string]podRef{}
	for _, p := range pods {
		for _, ep := range PodEndpoints(p, m.Ports) {
			eps = append(eps, ep)
			names[ep.Name] = podRef{name: p.Name, uid: p.UID, owner: metav1.GetControllerOf(p), label: p.Labels[k.RoleLabel]}
		}
	}
	now := k.Now()
	res := k.Source.Reconcile(k.Fleet, eps, now)
	k.mu.Lock()
	defer k.mu.Unlock()
	if !slices.Equal(res.Problems, k.status.Problems) {
		for _, p := range res.Problems {
			k.Log.Warn("discovery.kubernetes: pod not taken as it is", "problem", p)
		}
	}
	if len(eps) == 0 && !k.status.Synced {
		k.Log.Warn("discovery.kubernetes: no Ready pod matches", "namespace", k.Config.Namespace, "selector", m.Selector.String())
	}
	if res.Changed() {
		k.Log.Info("discovery.kubernetes: fleet reconciled", "added", res.Added, "removed", res.Removed, "relabelled", res.Moved)
	}
	for _, id := range res.Unprofiled {
		k.Log.Warn("discovery.kubernetes: "+UnprofiledLine, "engine", id, "profile", k.Source.cfg.DiscoveredProfile(""), "label", k.Source.cfg.Discovery.ProfileLabel)
	}
	k.pods = names
	owned := map[types.UID]bool{}
	for _, r := range names {
		if r.owner != nil {
			owned[r.owner.UID] = true
		}
	}
	for uid := range k.owners { // forget the owners no pod has any more
		if !owned[uid] {
			delete(k.owners, uid)
		}
	}
	k.status.Synced, k.status.Read, k.status.Engines, k.status.Problems = true, now, len(eps), res.Problems
	if k.OnRead != nil {
		s := k.status
		s.Problems = slices.Clone(s.Problems)
		k.OnRead(s)
	}
}

// followRoles queues a label write for every role change the controller makes to an engine
// of Kubernetes (an operator's relabel is the label already).
func (k *Kubernetes) followRoles() (stop func()) {
	return k.Fleet.OnChange(func(ev fleet.Event) {
		if ev.Kind != fleet.EventRole || ev.Operator {
			return
		}
		select {
		case k.writes <- roleWrite{engine: ev.Engine, role: ev.To}:
		default:
			k.Log.Warn("discovery.kubernetes: role label writes backed up; this one is dropped (the next resync corrects nothing: write it by hand)", "engine", ev.Engine, "role", ev.To)
		}
	})
}

// writeLabels patches each queued role onto its pod, retrying with backoff (up to a minute).
func (k *Kubernetes) writeLabels(ctx context.Context) {
	for {
		var w roleWrite
		select {
		case <-ctx.Done():
			return
		case w = <-k.writes:
		}
		e, ok := k.Fleet.Engine(w.engine)
		if !ok || e.Source != SourceKubernetes {
			continue
		}
		k.mu.Lock()
		ref, ok := k.pods[w.engine]
		k.mu.Unlock()
		if !ok {
			continue
		}
		pod := ref.name
		if OpenLabel(ref.label) {
			// The operator said the pod can play both: its role is Narwhal's to choose, kept in
			// Narwhal's state and xDS; the label stays as written.
			k.Log.Debug("discovery.kubernetes: role label left as the operator wrote it", "pod", pod, "label", ref.label, "role", w.role)
			continue
		}
		if why := k.ownerRefuses(ctx, ref); why != "" {
			k.mu.Lock()
			k.status.LabelRefused++
			if why != k.status.LabelRefusal {
				k.Log.Error("discovery.kubernetes: role label not written", "pod", pod, "role", w.role, "why", why)
			}
			k.status.LabelRefusal = why
			k.mu.Unlock()
			continue
		}
		err := k.patchRole(ctx, ref, w.role)
		k.mu.Lock()
		switch {
		case err == nil:
			k.status.LabelWrites++
		case errors.Is(err, context.Canceled):
		default:
			k.status.LabelErrors++
			msg := err.Error()
			if apierrors.IsForbidden(err) {
				msg = fmt.Sprintf("forbidden to patch pods in namespace %s: grant patch on pods to Narwhal's service account (docs/kubernetes.md, RBAC): %v", k.Config.Namespace, err)
			}
			if msg != k.status.LabelError {
				k.Log.Error("discovery.kubernetes: role label not written", "pod", pod, "role", w.role, "err", msg)
			}
			k.status.LabelError = msg
		}
		k.mu.Unlock()
	}
}

// patchRole writes role to the pod's role label, retrying with backoff (up to about a minute)
// what may pass. The pod's UID in the patch is a precondition: a pod recreated under the same
// name (a StatefulSet's) is another engine, and does not inherit its predecessor's role.
func (k *Kubernetes) patchRole(ctx context.Context, ref podRef, role string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": ref.uid, "labels": map[string]string{k.RoleLabel: role}}})
	var err error
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		_, err = k.Client.Resource(podResource).Namespace(k.Config.Namespace).Patch(ctx, ref.name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "narwhal"})
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err) || ctx.Err() != nil || delay >= 10*time.Second {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// ownerRefuses says why the role label must not be written to a pod ("" when it may): its
// controlling owner (a ReplicaSet, StatefulSet, DaemonSet, ReplicationController or Job) selects
// its pods on the role label — llm-d's modelservice chart does — so a new value would take the
// pod out of its owner, which would start a replacement GPU pod; or the owner cannot be read to
// check. A refusal is cached per owner: a workload's selector does not change.
func (k *Kubernetes) ownerRefuses(ctx context.Context, ref podRef) string {
	o := ref.owner
	if o == nil {
		return ""
	}
	k.mu.Lock()
	why, ok := k.owners[o.UID]
	k.mu.Unlock()
	if ok {
		return why
	}
	var keys []string
	var err error
	ns := k.Config.Namespace
	selectorKeys := func(s *metav1.LabelSelector) {
		if s == nil {
			return
		}
		for key := range s.MatchLabels {
			keys = append(keys, key)
		}
		for _, e := range s.MatchExpressions {
			keys = append(keys, e.Key)
		}
	}
	resource := strings.ToLower(o.Kind) + "s"
	// get reads the owner (of group, version v1) into its struct.
	get := func(group string, into any) error {
		u, err := k.Client.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}).Namespace(ns).Get(ctx, o.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)
	}
	switch o.Kind {
	case "ReplicaSet":
		var rs appsv1.ReplicaSet
		if err = get(appsv1.GroupName, &rs); err == nil {
			selectorKeys(rs.Spec.Selector)
		}
	case "StatefulSet":
		var ss appsv1.StatefulSet
		if err = get(appsv1.GroupName, &ss); err == nil {
			selectorKeys(ss.Spec.Selector)
		}
	case "DaemonSet":
		var ds appsv1.DaemonSet
		if err = get(appsv1.GroupName, &ds); err == nil {
			selectorKeys(ds.Spec.Selector)
		}
	case "ReplicationController":
		var rc corev1.ReplicationController
		if err = get(corev1.GroupName, &rc); err == nil {
			keys = slices.Collect(maps.Keys(rc.Spec.Selector))
		}
	case "Job":
		var j batchv1.Job
		if err = get(batchv1.GroupName, &j); err == nil {
			selectorKeys(j.Spec.Selector)
		}
	default:
		return "" // an owner Narwhal does not know selects its pods its own way
	}
	switch {
	case ctx.Err() != nil:
		return ""
	case err != nil:
		// Not cached: RBAC may be granted, the API server may come back.
		return fmt.Sprintf("cannot read the pod's owner %s %s to check that its selector leaves %s alone (grant get on %s to Narwhal's service account; docs/kubernetes.md, RBAC): %v",
			o.Kind, o.Name, k.RoleLabel, resource, err)
	case slices.Contains(keys, k.RoleLabel):
		why = fmt.Sprintf("the pod's owner %s %s selects its pods on %s: a new value would take the pod out of it, and it would start a replacement pod. Roles stay in Narwhal's state and xDS; set discovery.kubernetes.write_role_label: false, or select the workload's pods without %s (docs/kubernetes.md)",
			o.Kind, o.Name, k.RoleLabel, k.RoleLabel)
	}
	k.mu.Lock()
	k.owners[o.UID] = why
	k.mu.Unlock()
	return why
}
