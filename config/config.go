// Package config holds Narwhal's configuration schema, its defaults, the embedded default
// config and strict validation. Every key has a default; durations are seconds as numbers
// in keys ending in _s. Names are fixed by the contract (README, "Configuration").
package config

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DefaultProfileName names the measured profile the embedded default ships: Llama-3.1-8B-FP8
// on one H200 with vLLM (TP1), fitted to the profiling data published with NVIDIA Dynamo.
const DefaultProfileName = "llama-3.1-8b-fp8-h200"

// Role names, as they appear in the config and everywhere in the contract.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Config is the whole Narwhal configuration.
type Config struct {
	Listen         Listen             `yaml:"listen" json:"listen"`
	TLS            TLS                `yaml:"tls" json:"tls"`
	Admin          Admin              `yaml:"admin" json:"admin"`
	SLO            SLO                `yaml:"slo" json:"slo"`
	Router         Router             `yaml:"router" json:"router"`
	Controller     Controller         `yaml:"controller" json:"controller"`
	Health         Health             `yaml:"health" json:"health"`
	XDS            XDS                `yaml:"xds" json:"xds"`
	ShutdownGraceS float64            `yaml:"shutdown_grace_s" json:"shutdown_grace_s"`
	State          State              `yaml:"state" json:"state"`
	HA             HA                 `yaml:"ha" json:"ha"`
	Sim            Sim                `yaml:"sim" json:"sim"`
	Discovery      Discovery          `yaml:"discovery" json:"discovery"`
	Profiles       map[string]Profile `yaml:"profiles" json:"profiles"`
	Engines        []Engine           `yaml:"engines" json:"engines"`
}

// Discovery configures the engines that join and leave the fleet at run time
// (docs/discovery.md): from the admin API, a watched endpoints file, or Kubernetes. The
// engines list stays the fixed part of the fleet.
type Discovery struct {
	// RoleLabel is the label that carries an engine's role: prefill, decode, or
	// prefill-decode or none (the controller decides).
	RoleLabel string `yaml:"role_label" json:"role_label"`
	// ProfileLabel is the label that names an engine's profile; DefaultProfile is the profile
	// of an engine without one ("": the only profile, when the config has one).
	ProfileLabel   string `yaml:"profile_label" json:"profile_label"`
	DefaultProfile string `yaml:"default_profile" json:"default_profile"`
	// Switch is how discovered engines change role (SwitchRouting or SwitchSGLang).
	Switch     string              `yaml:"switch" json:"switch"`
	File       DiscoveryFile       `yaml:"file" json:"file"`
	Kubernetes DiscoveryKubernetes `yaml:"kubernetes" json:"kubernetes"`
}

// DiscoveryKubernetes takes engines from pods (docs/kubernetes.md): those of a namespace that
// match a label selector, each pod IP × port one engine, or the members of a Gateway API
// Inference Extension InferencePool (its spec.selector and spec.targetPorts).
type DiscoveryKubernetes struct {
	// Namespace of the pods ("": no Kubernetes discovery).
	Namespace string `yaml:"namespace" json:"namespace"`
	// Selector and Ports pick the pods and their engine ports; or InferencePool names the pool
	// that does (inference.networking.k8s.io/v1).
	Selector      string `yaml:"selector" json:"selector"`
	Ports         []int  `yaml:"ports" json:"ports"`
	InferencePool string `yaml:"inference_pool" json:"inference_pool"`
	// Kubeconfig is the client config file ("": in-cluster, as a pod).
	Kubeconfig string `yaml:"kubeconfig" json:"kubeconfig"`
	// WriteRoleLabel: a role change by the controller is written to the pod's role label.
	WriteRoleLabel bool `yaml:"write_role_label" json:"write_role_label"`
	// ResyncS is the informers' resync period.
	ResyncS float64 `yaml:"resync_s" json:"resync_s"`
}

// Enabled reports whether engines come from Kubernetes.
func (k *DiscoveryKubernetes) Enabled() bool { return k.Namespace != "" }

// DiscoveryFile watches an endpoints file in llm-d's file-discovery layout:
// endpoints: [{name, address, port, labels}].
type DiscoveryFile struct {
	// Path is the file ("": no file discovery). Its directory is watched, so atomic renames
	// and ConfigMap symlink swaps are seen.
	Path string `yaml:"path" json:"path"`
	// ResyncS: the file is read again this often even without a change notice.
	ResyncS float64 `yaml:"resync_s" json:"resync_s"`
}

// Discovery labels (llm-d's conventions).
const (
	LabelRole    = "llm-d.ai/role"
	LabelProfile = "narwhal.dev/profile"
	// LabelRoles (a label or an annotation, comma-separated) says which roles a discovered
	// engine can play, as engines[].roles does for a configured one: in llm-d's topology a
	// prefill pod has no P/D sidecar and can play prefill only.
	LabelRoles        = "narwhal.dev/roles"
	RolePrefillDecode = "prefill-decode"
	// RoleBoth is llm-d's deprecated name of prefill-decode, still accepted.
	RoleBoth = "both"
)

// Dynamic reports whether engines may join at run time from a source other than the admin API.
func (d *Discovery) Dynamic() bool { return d.File.Path != "" || d.Kubernetes.Enabled() }

// DiscoveredProfile is the profile of a discovered engine whose profile label is name ("" when it has
// none): name, else DefaultProfile, else the config's only profile.
func (c *Config) DiscoveredProfile(name string) string {
	switch {
	case name != "":
		return name
	case c.Discovery.DefaultProfile != "":
		return c.Discovery.DefaultProfile
	case len(c.Profiles) == 1:
		for p := range c.Profiles {
			return p
		}
	}
	return ""
}

// State configures the durable state of a single instance (docs/durable-state.md).
type State struct {
	// Dir holds the state file; "" is DefaultStateDir.
	Dir string `yaml:"dir" json:"dir"`
}

// HA configures several replicas sharing one fleet (docs/ha.md): on etcd, or on the Kubernetes
// API server (a Lease and a ConfigMap; docs/kubernetes.md); with neither Narwhal is a single
// instance.
type HA struct {
	Etcd       Etcd         `yaml:"etcd" json:"etcd"`
	Kubernetes HAKubernetes `yaml:"kubernetes" json:"kubernetes"`
	LeaseTTLS  int          `yaml:"lease_ttl_s" json:"lease_ttl_s"`
}

// Etcd is the etcd cluster the replicas share.
type Etcd struct {
	Endpoints []string `yaml:"endpoints" json:"endpoints"`
	Prefix    string   `yaml:"prefix" json:"prefix"`
	TLS       EtcdTLS  `yaml:"tls" json:"tls"`
}

// EtcdTLS are the client TLS files; all empty means plain connections.
type EtcdTLS struct {
	CAFile   string `yaml:"ca_file" json:"ca_file"`
	CertFile string `yaml:"cert_file" json:"cert_file"`
	KeyFile  string `yaml:"key_file" json:"key_file"`
}

// Enabled reports whether replicas share state on etcd.
func (h HA) Enabled() bool { return len(h.Etcd.Endpoints) > 0 || h.Kubernetes.Namespace != "" }

// HAKubernetes elects the leader with the coordination.k8s.io Lease Name and keeps the durable
// state in the ConfigMap Name-state, in Namespace.
type HAKubernetes struct {
	Namespace  string `yaml:"namespace" json:"namespace"` // "": not on Kubernetes
	Name       string `yaml:"name" json:"name"`
	Kubeconfig string `yaml:"kubeconfig" json:"kubeconfig"` // "": in-cluster
}

// StateDir is the directory of the state file: Dir, or DefaultStateDir when it is "".
func (s State) StateDir() string {
	if s.Dir == "" {
		return DefaultStateDir()
	}
	return s.Dir
}

// DefaultStateDir is state.dir when the config leaves it empty: narwhal under the user's state
// home ($XDG_STATE_HOME, else ~/.local/state), an absolute path whatever the working directory;
// ./narwhal-state made absolute when there is no home directory.
func DefaultStateDir() string {
	if x := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "narwhal")
	}
	if home, err := os.UserHomeDir(); err == nil && filepath.IsAbs(home) {
		return filepath.Join(home, ".local", "state", "narwhal")
	}
	if abs, err := filepath.Abs(LegacyStateDir); err == nil {
		return abs
	}
	return LegacyStateDir
}

// LegacyStateDir is where state.dir "" kept the state before DefaultStateDir (relative to the
// working directory): serve points at a state file left there.
const LegacyStateDir = "narwhal-state"

// Listen holds the addresses Narwhal's servers bind to.
type Listen struct {
	ExtProc string `yaml:"extproc" json:"extproc"`
	XDS     string `yaml:"xds" json:"xds"`
	Admin   string `yaml:"admin" json:"admin"`
	// Health, when set, serves the gRPC health service (the ext_proc listener's, the same
	// status) on a plaintext port of its own, as the Gateway API Inference Extension's picker
	// does (its charts probe port 9003).
	Health string `yaml:"health" json:"health"`
}

// TLS is the TLS of each listener (docs/security.md); a listener without cert_file is plaintext.
type TLS struct {
	ExtProc ListenerTLS `yaml:"extproc" json:"extproc"`
	XDS     ListenerTLS `yaml:"xds" json:"xds"`
	Admin   ListenerTLS `yaml:"admin" json:"admin"`
}

// ListenerTLS names a listener's certificate and key and, for mutual TLS, the CA its clients'
// certificates must chain to. The files are read again when they change.
type ListenerTLS struct {
	CertFile     string `yaml:"cert_file" json:"cert_file"`
	KeyFile      string `yaml:"key_file" json:"key_file"`
	ClientCAFile string `yaml:"client_ca_file" json:"client_ca_file"`
}

// Enabled reports whether the listener serves TLS.
func (l ListenerTLS) Enabled() bool { return l.CertFile != "" }

// Mutual reports whether clients must present a certificate from ClientCAFile.
func (l ListenerTLS) Mutual() bool { return l.ClientCAFile != "" }

// Admin configures the admin HTTP API.
type Admin struct {
	// Token, when set, is required as "Authorization: Bearer <token>" on mutating calls; or
	// TokenFile names a file holding it, or TokenEnv an environment variable (ResolveToken).
	Token     string `yaml:"token" json:"-"`
	TokenFile string `yaml:"token_file" json:"token_file"`
	TokenEnv  string `yaml:"token_env" json:"token_env"`
	// Identities, when set, are the client-certificate names (tlsfiles: URI SAN, DNS SAN, or the
	// common name of a certificate without SANs) whose holders may make mutating calls; needs
	// tls.admin.client_ca_file. With it, mutual TLS stands for the token off loopback.
	Identities []string `yaml:"identities" json:"identities"`
	// Hosts are the host names (no port) the admin API answers for besides loopback names
	// and IP addresses: a request whose Host is another name is refused 421 (DNS rebinding).
	Hosts   []string `yaml:"hosts" json:"hosts"`
	History History  `yaml:"history" json:"history"`
}

// HasToken reports whether a token is configured, in any of its three places.
func (a Admin) HasToken() bool { return a.Token != "" || a.TokenFile != "" || a.TokenEnv != "" }

// ResolveToken returns the admin token: admin.token, else the content of admin.token_file
// (surrounding space trimmed), else the value of the environment variable admin.token_env; ""
// when none is set. A file or variable that is missing or empty is an error, and so is a token
// anyone could guess (CheckToken).
func (a Admin) ResolveToken() (string, error) {
	var t, where string
	switch {
	case a.Token != "":
		t, where = a.Token, "admin.token"
	case a.TokenFile != "":
		data, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return "", fmt.Errorf("admin.token_file: %w", err)
		}
		if t = strings.TrimSpace(string(data)); t == "" {
			return "", fmt.Errorf("admin.token_file %s is empty", a.TokenFile)
		}
		where = "admin.token_file " + a.TokenFile
	case a.TokenEnv != "":
		if t = os.Getenv(a.TokenEnv); t == "" {
			return "", fmt.Errorf("admin.token_env: the environment variable %s is not set or empty", a.TokenEnv)
		}
		where = "admin.token_env " + a.TokenEnv
	default:
		return "", nil
	}
	if err := CheckToken(t); err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	return t, nil
}

// MinTokenBytes is the shortest admin token accepted: 32 bytes, as `openssl rand -hex 16`
// prints (128 random bits).
const MinTokenBytes = 32

// CheckToken refuses an admin token anyone could guess: the examples' placeholder, or one
// shorter than MinTokenBytes. The error says how to make one, and never repeats the token.
func CheckToken(t string) error {
	const how = "make one with `openssl rand -hex 32` (or `head -c 32 /dev/urandom | base64`)"
	lower := strings.ToLower(t)
	switch {
	case strings.Contains(lower, "change-me"), strings.Contains(lower, "changeme"):
		return fmt.Errorf("the token is a placeholder: %s", how)
	case len(t) < MinTokenBytes:
		return fmt.Errorf("the token is %d bytes, fewer than %d: %s", len(t), MinTokenBytes, how)
	}
	return nil
}

// OffLoopback reports whether a listen address (host:port) is reachable from other machines:
// any host but a loopback IP or "localhost" (an empty host, 0.0.0.0 and :: are every interface).
func OffLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	if host == "localhost" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsLoopback()
}

// History bounds the in-process history GET /narwhal/history serves (docs/history.md): a
// sample of the fleet and the data path every IntervalS, the last Samples of them, and the last
// Decisions decision records.
type History struct {
	Samples   int     `yaml:"samples" json:"samples"`
	IntervalS float64 `yaml:"interval_s" json:"interval_s"`
	Decisions int     `yaml:"decisions" json:"decisions"`
}

// SLO is the service-level objective every projection is priced against.
type SLO struct {
	TTFTS float64 `yaml:"ttft_s" json:"ttft_s"`
	TPOTS float64 `yaml:"tpot_s" json:"tpot_s"`
}

// Router configures the data path: paths, body limits, the waiting set and placement.
type Router struct {
	Paths               []string       `yaml:"paths" json:"paths"`
	BodyLimitBytes      int64          `yaml:"body_limit_bytes" json:"body_limit_bytes"`
	WaitingSet          WaitingSet     `yaml:"waiting_set" json:"waiting_set"`
	Admission           Admission      `yaml:"admission" json:"admission"`
	Demand              Demand         `yaml:"demand" json:"demand"`
	DefaultOutputTokens int            `yaml:"default_output_tokens" json:"default_output_tokens"`
	FirstTokenTimeoutS  float64        `yaml:"first_token_timeout_s" json:"first_token_timeout_s"`
	Handoff             string         `yaml:"handoff" json:"handoff"`
	Sizing              Sizing         `yaml:"sizing" json:"sizing"`
	PrefixAffinity      PrefixAffinity `yaml:"prefix_affinity" json:"prefix_affinity"`
	// LocalPrefill says when a decode engine prefills a request itself instead of a prefill
	// engine (LocalPrefillAuto, LocalPrefillOff, LocalPrefillAlways; docs/role-control.md
	// section 3); LocalPrefillMaxTokens bounds the prompt tokens it prefills so.
	LocalPrefill          string `yaml:"local_prefill" json:"local_prefill"`
	LocalPrefillMaxTokens int    `yaml:"local_prefill_max_tokens" json:"local_prefill_max_tokens"`
}

// Local-prefill modes (router.local_prefill).
const (
	// LocalPrefillAuto prices both paths for each request: local when its projected first token
	// is sooner and the decode engine's residents keep their TPOT within the SLO.
	LocalPrefillAuto = "auto"
	// LocalPrefillOff disaggregates every request while a prefill engine is live.
	LocalPrefillOff = "off"
	// LocalPrefillAlways prefills locally whenever a decode engine has room.
	LocalPrefillAlways = "always"
)

// Handoff directions (router.handoff).
const (
	HandoffDecode  = "decode"  // Envoy sends to the decode engine, which pulls prefill (llm-d convention)
	HandoffPrefill = "prefill" // Envoy sends to the prefill engine, which pushes to the named decoder
)

// Sizing methods (router.sizing.method).
const (
	SizingBytes = "bytes"
	SizingBPE   = "bpe"
)

// WaitingSet bounds the FIFO of admitted offers not yet dispatched.
type WaitingSet struct {
	Capacity int     `yaml:"capacity" json:"capacity"`
	MaxWaitS float64 `yaml:"max_wait_s" json:"max_wait_s"`
}

// Admission configures predictive admission.
type Admission struct {
	// RejectRatio > 0 rejects offers whose best projected TTFT exceeds RejectRatio × slo.ttft_s.
	RejectRatio float64 `yaml:"reject_ratio" json:"reject_ratio"`
}

// Demand sets the horizons of the short and long demand estimates.
type Demand struct {
	ShortHorizonS float64 `yaml:"short_horizon_s" json:"short_horizon_s"`
	LongHorizonS  float64 `yaml:"long_horizon_s" json:"long_horizon_s"`
}

// Sizing selects how prompts are sized locally.
type Sizing struct {
	Method string `yaml:"method" json:"method"`
	// Encoding is the BPE vocabulary of method bpe (embedded in the binary).
	Encoding string `yaml:"encoding" json:"encoding"`
	// NonTextTokens is the token cost of one non-text content part (an image, audio...).
	NonTextTokens int `yaml:"non_text_tokens" json:"non_text_tokens"`
}

// BPE encodings that method bpe can use.
var Encodings = []string{"cl100k_base", "o200k_base", "p50k_base", "r50k_base"}

// PrefixAffinity configures the prompt-prefix affinity index.
type PrefixAffinity struct {
	Enabled     bool `yaml:"enabled" json:"enabled"`
	BlockTokens int  `yaml:"block_tokens" json:"block_tokens"`
	Entries     int  `yaml:"entries" json:"entries"`
}

// Controller configures role control (docs/role-control.md).
type Controller struct {
	Advisory   bool       `yaml:"advisory" json:"advisory"`
	MinPrefill int        `yaml:"min_prefill" json:"min_prefill"`
	MinDecode  int        `yaml:"min_decode" json:"min_decode"`
	Monitor    Monitor    `yaml:"monitor" json:"monitor"`
	Profile    ProfileFit `yaml:"profile" json:"profile"`
	Reactive   Reactive   `yaml:"reactive" json:"reactive"`
	Thresholds Thresholds `yaml:"thresholds" json:"thresholds"`
	// SwitchTimeoutS bounds one in-place role switch (POST /pd_role_switch on an engine with
	// switch: sglang): past it the switch has failed.
	SwitchTimeoutS float64 `yaml:"switch_timeout_s" json:"switch_timeout_s"`
}

// Monitor sets the cadence of floor repair passes.
type Monitor struct {
	IntervalS float64 `yaml:"interval_s" json:"interval_s"`
}

// ProfileFit sets how many observations an engine needs before its correction counts.
type ProfileFit struct {
	MinSamples int `yaml:"min_samples" json:"min_samples"`
}

// Reactive sets the cadence of evaluations and the arrival-evidence window.
type Reactive struct {
	StepS               float64 `yaml:"step_s" json:"step_s"`
	UrgentDelayS        float64 `yaml:"urgent_delay_s" json:"urgent_delay_s"`
	EvidenceSpanS       float64 `yaml:"evidence_span_s" json:"evidence_span_s"`
	EvidenceMinArrivals int     `yaml:"evidence_min_arrivals" json:"evidence_min_arrivals"`
	EvidenceMaxSpanS    float64 `yaml:"evidence_max_span_s" json:"evidence_max_span_s"`
}

// Thresholds holds the pressure thresholds and gates of role moves.
type Thresholds struct {
	Expand            float64    `yaml:"expand" json:"expand"`
	Shrink            float64    `yaml:"shrink" json:"shrink"`
	ConfirmPasses     int        `yaml:"confirm_passes" json:"confirm_passes"`
	MinGain           float64    `yaml:"min_gain" json:"min_gain"`
	TrendTolerance    float64    `yaml:"trend_tolerance" json:"trend_tolerance"`
	CooldownS         float64    `yaml:"cooldown_s" json:"cooldown_s"`
	DwellS            float64    `yaml:"dwell_s" json:"dwell_s"`
	FlipResidentGuard int        `yaml:"flip_resident_guard" json:"flip_resident_guard"`
	OpenWindow        OpenWindow `yaml:"open_window" json:"open_window"`
}

// OpenWindow holds the thresholds used while the arrival-evidence window is open.
type OpenWindow struct {
	Expand float64 `yaml:"expand" json:"expand"`
	Shrink float64 `yaml:"shrink" json:"shrink"`
}

// Health configures the engine health monitor.
type Health struct {
	Path           string  `yaml:"path" json:"path"`
	IntervalS      float64 `yaml:"interval_s" json:"interval_s"`
	TimeoutS       float64 `yaml:"timeout_s" json:"timeout_s"`
	UnhealthyAfter int     `yaml:"unhealthy_after" json:"unhealthy_after"`
	HealthyAfter   int     `yaml:"healthy_after" json:"healthy_after"`
	RecoverS       float64 `yaml:"recover_s" json:"recover_s"`
	Passive        Passive `yaml:"passive" json:"passive"`
	Metrics        Metrics `yaml:"metrics" json:"metrics"`
}

// Metrics configures the reading of the engines' own metrics (docs/engine-metrics.md): their
// schedulers' running and waiting requests and KV-cache usage under vLLM's or SGLang's names,
// which the projection counts beyond Narwhal's own requests, and their finished counts, which
// check the disaggregated handoff from the prefill side.
type Metrics struct {
	Path string `yaml:"path" json:"path"`
	// IntervalS is the time between two readings of one engine; 0 turns the reading off.
	IntervalS float64 `yaml:"interval_s" json:"interval_s"`
	TimeoutS  float64 `yaml:"timeout_s" json:"timeout_s"`
}

// Passive configures passive health checking: failures seen on the data path, as Envoy's
// outlier detection counts them.
type Passive struct {
	// ConsecutiveFailures upstream failures in a row (a 5xx, or a reset Envoy answers with
	// one) take an engine out of placement at once and mark it failed; the probes readmit
	// it. 0 turns passive checking off.
	ConsecutiveFailures int `yaml:"consecutive_failures" json:"consecutive_failures"`
}

// XDS configures the resources Narwhal publishes to Envoy.
type XDS struct {
	ClusterPrefix string `yaml:"cluster_prefix" json:"cluster_prefix"`
	// Nodes, when set, are the only node ids the ADS server answers; any other Envoy gets no
	// resources (its stream is refused). An id is what the Envoy says it is: with mutual TLS on
	// listen.xds, Identities bind it to a certificate.
	Nodes []string `yaml:"nodes" json:"nodes"`
	// Identities, when set, are the client-certificate names (a URI SAN such as a SPIFFE ID, a
	// DNS SAN or the subject common name) allowed to open ADS streams; needs
	// tls.xds.client_ca_file.
	Identities []string `yaml:"identities" json:"identities"`
}

// Sim is read only by `narwhal sim`.
type Sim struct {
	NoiseSigma float64 `yaml:"noise_sigma" json:"noise_sigma"`
	Truth      Truth   `yaml:"truth" json:"truth"`
	Faults     []Fault `yaml:"faults" json:"faults"`
}

// Truth scales the true speed of simulated engines relative to their profiles.
type Truth struct {
	PrefillScale float64 `yaml:"prefill_scale" json:"prefill_scale"`
	DecodeScale  float64 `yaml:"decode_scale" json:"decode_scale"`
}

// Fault is one scheduled fault in a simulation.
type Fault struct {
	AtS    float64 `yaml:"at_s" json:"at_s"`
	Engine string  `yaml:"engine" json:"engine"`
	Kind   string  `yaml:"kind" json:"kind"` // fail, recover, drain, undrain
}

// Profile is the measured curves of one engine class. A profile may lack the curve of a
// phase (an engine class that only prefills, say); an engine then cannot hold that role.
type Profile struct {
	Prefill            *PrefillCurve `yaml:"prefill" json:"prefill,omitempty"`
	PrefillConcurrency int           `yaml:"prefill_concurrency" json:"prefill_concurrency"`
	Decode             *DecodeCurve  `yaml:"decode" json:"decode,omitempty"`
	KVTransferS        float64       `yaml:"kv_transfer_s" json:"kv_transfer_s"`
	// ChunkedPrefill says how the engine prefills a prompt that reaches it unprefilled: in
	// chunks beside its decode batch, as vLLM V1 does by default, or in one step while its
	// decode batch waits.
	ChunkedPrefill ChunkedPrefill `yaml:"chunked_prefill" json:"chunked_prefill"`
}

// ChunkedPrefill is an engine's per-step token budget (vLLM's max_num_batched_tokens; 0:
// unchunked): every step carries one token for each decoding stream first, and a chunk of the
// prompt being prefilled in what is left; the chunk adds its share of the prefill curve to the
// step.
type ChunkedPrefill struct {
	BudgetTokens int `yaml:"budget_tokens" json:"budget_tokens"`
}

// PrefillCurve gives the seconds to prefill one prompt of N tokens alone:
// BaseS + PerTokenS·N + PerToken2S·N².
type PrefillCurve struct {
	BaseS      float64 `yaml:"base_s" json:"base_s"`
	PerTokenS  float64 `yaml:"per_token_s" json:"per_token_s"`
	PerToken2S float64 `yaml:"per_token2_s" json:"per_token2_s"`
	MaxTokens  int     `yaml:"max_tokens" json:"max_tokens"` // profiled range (coverage)
}

// Seconds is the profiled prefill time of one prompt of n tokens.
func (c *PrefillCurve) Seconds(n int) float64 {
	x := float64(n)
	return c.BaseS + c.PerTokenS*x + c.PerToken2S*x*x
}

// DecodeCurve gives the seconds per output token per stream:
// BaseS + PerStreamS·streams + PerKVTokenS·kvTokens.
type DecodeCurve struct {
	BaseS       float64 `yaml:"base_s" json:"base_s"`
	PerStreamS  float64 `yaml:"per_stream_s" json:"per_stream_s"`
	PerKVTokenS float64 `yaml:"per_kv_token_s" json:"per_kv_token_s"`
	MaxStreams  int     `yaml:"max_streams" json:"max_streams"`
	MaxKVTokens int     `yaml:"max_kv_tokens" json:"max_kv_tokens"`
}

// StepSeconds is the profiled duration of one decode step (one token for every resident
// stream) with the given number of streams and KV tokens resident.
func (c *DecodeCurve) StepSeconds(streams, kvTokens int) float64 {
	return c.BaseS + c.PerStreamS*float64(streams) + c.PerKVTokenS*float64(kvTokens)
}

// Engine is one model server as configured.
type Engine struct {
	ID      string `yaml:"id" json:"id"`
	Address string `yaml:"address" json:"address"`
	Role    string `yaml:"role" json:"role"`
	Profile string `yaml:"profile" json:"profile"`
	Pinned  bool   `yaml:"pinned" json:"pinned"`
	// Switch is how the engine changes role: SwitchRouting (routing alone) or SwitchSGLang
	// (held out of placement, drained, then told: POST /pd_role_switch).
	Switch string `yaml:"switch" json:"switch"`
	// Roles are the roles the engine can play; empty, both. In llm-d's topology a prefill
	// engine has no P/D sidecar in front of it to decode for another, and a decode engine's
	// sidecar sends every prefill elsewhere (docs/interop.md): each can play one role. An engine
	// that can play one role keeps it, as a pinned one does, and cannot be unpinned.
	Roles []string `yaml:"roles" json:"roles,omitempty"`
	// Health is where this engine's probe goes, when not health.path on its own port: behind
	// llm-d's P/D sidecar, which answers GET /health itself whatever its engine does, the
	// engine's own port (docs/interop.md).
	Health EngineHealth `yaml:"health" json:"health"`
}

// EngineHealth is one engine's probe target: Path ("" = health.path) on Port (0 = the port of
// the engine's address), on the engine's host.
type EngineHealth struct {
	Path string `yaml:"path" json:"path"`
	Port int    `yaml:"port" json:"port"`
}

// CanPlay reports whether the engine can play role (engines[].roles).
func (e *Engine) CanPlay(role string) bool {
	return len(e.Roles) == 0 || slices.Contains(e.Roles, role)
}

// OnlyRole is the one role the engine can play, "" when it can play both.
func (e *Engine) OnlyRole() string {
	if len(e.Roles) == 1 {
		return e.Roles[0]
	}
	return ""
}

// SwitchesInPlace reports whether the engine must be told to change role (switch: sglang).
func (e *Engine) SwitchesInPlace() bool { return e.Switch == SwitchSGLang }

// Switch methods (engines[].switch; docs/role-control.md section 11).
const (
	SwitchRouting = "routing"
	SwitchSGLang  = "sglang"
)

// Seconds converts a config duration in seconds to a time.Duration.
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// TimeAt is the first instant, to the nanosecond, at least s seconds after epoch as a core
// reckons (its Sub(epoch).Seconds() ≥ s): a core's deadline (seconds since its epoch) handed
// back to it as a time is reached, never a hair early — a caller driving virtual time would
// otherwise wake at it for ever. Whole seconds stay whole.
func TimeAt(epoch time.Time, s float64) time.Time {
	d := time.Duration(math.Ceil(s * float64(time.Second)))
	for d.Seconds() < s {
		d++
	}
	return epoch.Add(d)
}
