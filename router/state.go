package router

// Rates is one demand estimate.
type Rates struct {
	ArrivalsPerS     float64 `json:"arrivals_per_s"`
	PromptTokensPerS float64 `json:"prompt_tokens_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
}

// Max is the component-wise maximum (priced demand).
func (r Rates) Max(o Rates) Rates {
	return Rates{max(r.ArrivalsPerS, o.ArrivalsPerS), max(r.PromptTokensPerS, o.PromptTokensPerS), max(r.OutputTokensPerS, o.OutputTokensPerS)}
}

// Demand holds the short, long and priced demand estimates.
type Demand struct {
	Short  Rates `json:"short"`
	Long   Rates `json:"long"`
	Priced Rates `json:"priced"`
}

// Retained is the retained demand: samples in the demand windows and the work the router holds.
type Retained struct {
	Samples              int   `json:"samples"`
	Waiting              int   `json:"waiting"`
	WaitingTokens        int64 `json:"waiting_tokens"`
	Prefilling           int   `json:"prefilling"`
	AwaitingOutputTokens int64 `json:"awaiting_output_tokens"`
	Decoding             int   `json:"decoding"`
}

// Counters are the demand accounting counters (README). In every snapshot:
//
//	offers   = invalid + admitted + overflow (all but wait_timeout and shutting_down)
//	admitted = retained.waiting + dispatched + overflow.wait_timeout + overflow.shutting_down + cancelled.waiting
//	dispatched = retained.prefilling + retained.decoding + completed + failed + cancelled.in_flight
type Counters struct {
	Offers             uint64     `json:"offers"`
	Invalid            uint64     `json:"invalid"`
	Admitted           uint64     `json:"admitted"`
	Overflow           Overflow   `json:"overflow"`
	Dispatched         Dispatches `json:"dispatched"`
	Completed          uint64     `json:"completed"`
	Failed             uint64     `json:"failed"`
	Cancelled          Cancelled  `json:"cancelled"`
	FirstTokenTimeouts uint64     `json:"first_token_timeouts"`
	// ContextLengthExceeded counts offers answered 400 context_length_exceeded (also in Invalid).
	ContextLengthExceeded uint64 `json:"context_length_exceeded"`
	// LocalPromptTokens counts the prompt tokens of the requests placed on a decode engine to
	// prefill locally (Dispatches.Local).
	LocalPromptTokens uint64 `json:"local_prompt_tokens"`
	// Ejections counts engines taken out of placement by passive health checking.
	Ejections uint64 `json:"ejections"`
	// PassedThrough counts the requests outside router.paths sent to an engine (PassThrough):
	// not offers, and in none of the laws above.
	PassedThrough uint64 `json:"passed_through"`
}

// Overflow counts offers turned away, by reason.
type Overflow struct {
	WaitingSetFull   uint64 `json:"waiting_set_full"`
	PredictedSLOMiss uint64 `json:"predicted_slo_miss"`
	FallbackBusy     uint64 `json:"fallback_busy"`
	NoCapacity       uint64 `json:"no_capacity"`
	WaitTimeout      uint64 `json:"wait_timeout"`
	// ShuttingDown counts admitted requests answered 503 shutting_down: still waiting when the
	// shutdown grace ran out, or offered after it.
	ShuttingDown uint64 `json:"shutting_down"`
	// SubsetUnavailable counts offers whose subset hint named no engine able to be their
	// destination (429).
	SubsetUnavailable uint64 `json:"subset_unavailable"`
}

// Add counts one offer or request turned away with c (codes that are no overflow: none).
func (o *Overflow) Add(c Code) {
	switch c {
	case WaitingSetFull:
		o.WaitingSetFull++
	case PredictedSLOMiss:
		o.PredictedSLOMiss++
	case FallbackBusy:
		o.FallbackBusy++
	case NoCapacity:
		o.NoCapacity++
	case WaitTimeout:
		o.WaitTimeout++
	case ShuttingDown:
		o.ShuttingDown++
	case SubsetUnavailable:
		o.SubsetUnavailable++
	}
}

// Dispatches counts placements by kind.
type Dispatches struct {
	Disaggregated uint64 `json:"disaggregated"`
	// Aggregate counts the placements with both phases on one engine: on the fallback, and
	// on a decode engine prefilling locally (Local, which counts those again).
	Aggregate uint64 `json:"aggregate"`
	Local     uint64 `json:"local"`
}

// Total is every dispatch.
func (d Dispatches) Total() uint64 { return d.Disaggregated + d.Aggregate }

// Cancelled counts client cancels by where the request was.
type Cancelled struct {
	Waiting  uint64 `json:"waiting"`
	InFlight uint64 `json:"in_flight"`
}

// EngineLoad is one engine as the router sees it.
type EngineLoad struct {
	ID               string  `json:"id"`
	PrefillResidents int     `json:"prefill_residents"`
	DecodeResidents  int     `json:"decode_residents"` // streams decoding on it now
	ReservedStreams  int     `json:"reserved_streams"` // streams placed on it still prefilling elsewhere
	BusyUntilS       float64 `json:"busy_until_s"`     // projected prefill work left, seconds from now
	// DrainS is the projected time until everything on it is done — its prefill work and its
	// decode residents' remaining output — seconds from now: how long an engine switching role
	// in place is held before it can be asked (docs/role-control.md section 11).
	DrainS     float64    `json:"drain_s"`
	Correction Correction `json:"correction"`
	Fallback   bool       `json:"fallback,omitempty"`
	Prepared   bool       `json:"prepared,omitempty"` // a donor the controller is preparing (Router.Prepare)
	Passive    Passive    `json:"passive"`
	// Observed is what the engine's metrics said at their latest reading (engine_metrics), nil
	// when they are not read or could not be.
	Observed *Observed `json:"observed,omitempty"`
}

// Passive is one engine's passive health: upstream failures in a row on the data path, and
// whether they ejected it (out of placement until the fleet marks it failed).
type Passive struct {
	ConsecutiveFailures int  `json:"consecutive_failures"`
	Ejected             bool `json:"ejected"`
}

// Correction is an engine's online profile correction factor per phase (1 = as profiled).
type Correction struct {
	Prefill float64 `json:"prefill"`
	Decode  float64 `json:"decode"`
	// PrefillSamples and DecodeSamples count the observations folded into each factor.
	PrefillSamples int `json:"prefill_samples"`
	DecodeSamples  int `json:"decode_samples"`
}

// Snapshot is the router's state at one instant; its counters obey the conservation laws.
type Snapshot struct {
	Counters Counters     `json:"counters"`
	Retained Retained     `json:"retained"`
	Demand   Demand       `json:"demand"`
	Engines  []EngineLoad `json:"engines"`
	Fallback string       `json:"fallback,omitempty"` // the aggregate fallback engine, if any
}

// Conserved checks the three conservation laws; it returns the first one broken, or "".
func (s *Snapshot) Conserved() string {
	c, o := &s.Counters, &s.Counters.Overflow
	if c.Offers != c.Invalid+c.Admitted+o.WaitingSetFull+o.PredictedSLOMiss+o.FallbackBusy+o.NoCapacity+o.SubsetUnavailable {
		return "offers != invalid + admitted + overflow"
	}
	if c.Admitted != uint64(s.Retained.Waiting)+c.Dispatched.Total()+o.WaitTimeout+o.ShuttingDown+c.Cancelled.Waiting {
		return "admitted != waiting + dispatched + wait_timeout + shutting_down + cancelled.waiting"
	}
	if c.Dispatched.Total() != uint64(s.Retained.Prefilling+s.Retained.Decoding)+c.Completed+c.Failed+c.Cancelled.InFlight {
		return "dispatched != prefilling + decoding + completed + failed + cancelled.in_flight"
	}
	return ""
}
