package config

// Default returns the configuration every key falls back to: the contract's defaults, the
// default profile under DefaultProfileName, and no engines.
func Default() *Config {
	return &Config{
		Listen: Listen{ExtProc: "127.0.0.1:9002", XDS: "127.0.0.1:18000", Admin: "127.0.0.1:9090"},
		Admin:  Admin{Identities: []string{}, Hosts: []string{}, History: History{Samples: 3600, IntervalS: 1, Decisions: 1024}},
		SLO:    SLO{TTFTS: 0.5, TPOTS: 0.05},
		Router: Router{
			Paths:               []string{"/v1/completions", "/v1/chat/completions"},
			BodyLimitBytes:      4 << 20,
			WaitingSet:          WaitingSet{Capacity: 4096, MaxWaitS: 30},
			Demand:              Demand{ShortHorizonS: 10, LongHorizonS: 120},
			DefaultOutputTokens: 256,
			FirstTokenTimeoutS:  10,
			Handoff:             HandoffDecode,
			Sizing:              Sizing{Method: SizingBytes, Encoding: "cl100k_base", NonTextTokens: 576},
			PrefixAffinity:      PrefixAffinity{Enabled: true, BlockTokens: 64, Entries: 100000},
			LocalPrefill:        LocalPrefillAuto, LocalPrefillMaxTokens: 16384,
		},
		Controller: Controller{
			MinPrefill: 1,
			MinDecode:  1,
			Monitor:    Monitor{IntervalS: 1},
			Profile:    ProfileFit{MinSamples: 20},
			Reactive: Reactive{
				StepS:               5,
				UrgentDelayS:        0.25,
				EvidenceSpanS:       2,
				EvidenceMinArrivals: 50,
				EvidenceMaxSpanS:    120,
			},
			Thresholds: Thresholds{
				Expand:            0.9,
				Shrink:            0.5,
				ConfirmPasses:     3,
				MinGain:           0.05,
				TrendTolerance:    0.1,
				CooldownS:         20,
				DwellS:            60,
				FlipResidentGuard: 8,
				OpenWindow:        OpenWindow{Expand: 1.2, Shrink: 0.25},
			},
			SwitchTimeoutS: 120,
		},
		Health: Health{Path: "/health", IntervalS: 1, TimeoutS: 0.5, UnhealthyAfter: 3, HealthyAfter: 3, RecoverS: 10,
			Passive: Passive{ConsecutiveFailures: 3}, Metrics: Metrics{Path: "/metrics", IntervalS: 2, TimeoutS: 1}},
		XDS:            XDS{ClusterPrefix: "narwhal", Nodes: []string{}, Identities: []string{}},
		HA:             HA{Etcd: Etcd{Endpoints: []string{}, Prefix: "/narwhal"}, Kubernetes: HAKubernetes{Name: "narwhal"}, LeaseTTLS: 5},
		ShutdownGraceS: 30,
		Sim:            Sim{NoiseSigma: 0.05, Truth: Truth{PrefillScale: 1, DecodeScale: 1}},
		Discovery: Discovery{RoleLabel: LabelRole, ProfileLabel: LabelProfile, Switch: SwitchRouting,
			File: DiscoveryFile{ResyncS: 30}, Kubernetes: DiscoveryKubernetes{Ports: []int{}, ResyncS: 300}},
		Profiles: map[string]Profile{DefaultProfileName: DefaultProfile()},
	}
}

// DefaultProfile is the measured profile of Llama-3.1-8B-FP8 on one H200 with vLLM (TP1):
// about 27 ms to prefill 512 tokens, 49 ms at 2k, 170 ms at 8k; about 12 ms per output token
// at 64 streams of 3k context.
func DefaultProfile() Profile {
	return Profile{
		Prefill:            &PrefillCurve{BaseS: 0.0165, PerTokenS: 1.52e-5, PerToken2S: 4.21e-10, MaxTokens: 16384},
		PrefillConcurrency: 4,
		Decode:             &DecodeCurve{BaseS: 0.0045, PerStreamS: 2.8e-5, PerKVTokenS: 3.08e-8, MaxStreams: 256, MaxKVTokens: 945000},
		KVTransferS:        0.005,
		ChunkedPrefill:     ChunkedPrefill{BudgetTokens: 8192},
	}
}

// Defaults of the parts of a profile or engine that a config adds (the decoder applies them to
// every new map or list entry before reading its keys).
func (p *Profile) setDefaults() {
	d := DefaultProfile()
	p.PrefillConcurrency = d.PrefillConcurrency
	p.KVTransferS = d.KVTransferS
	p.ChunkedPrefill = d.ChunkedPrefill
}

func (c *PrefillCurve) setDefaults() { c.MaxTokens = DefaultProfile().Prefill.MaxTokens }

func (c *DecodeCurve) setDefaults() {
	d := DefaultProfile().Decode
	c.MaxStreams, c.MaxKVTokens = d.MaxStreams, d.MaxKVTokens
}

func (e *Engine) setDefaults() { e.Profile, e.Switch = DefaultProfileName, SwitchRouting }
