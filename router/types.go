package router

import "errors"

// Errors of the router's inputs. Handles of requests the router no longer holds (finished,
// rejected, or unknown) are refused with ErrUnknownRequest; callers may ignore it on races
// such as a cancel after a completion.
var (
	ErrUnknownRequest = errors.New("router: unknown request")
	ErrPhase          = errors.New("router: request is not in that phase")
)

// Handle identifies one admitted request while the router holds it. The zero Handle is never
// issued.
type Handle uint64

func makeHandle(slot int32, gen uint32) Handle {
	return Handle(uint64(gen)<<32 | uint64(uint32(slot)+1))
}

func (h Handle) slot() int32 { return int32(uint32(h)) - 1 }
func (h Handle) gen() uint32 { return uint32(h >> 32) }

// Offer is one valid, locally sized inference request.
type Offer struct {
	ID           string // Narwhal's request id (Envoy's x-request-id when present)
	PromptTokens int
	MaxTokens    int // the request's max_tokens / max_completion_tokens; 0 when unset
	// NonStreaming is a request with "stream": false: its response comes whole, so no first
	// token is observed. Its prefill residency ends at its projected prefill completion; it
	// has no first-token timeout and gives no correction samples.
	NonStreaming bool
	// Prefix holds the chained hashes of the prompt's prefix blocks (router.prefix_affinity
	// .block_tokens tokens each), for prefix affinity; the router uses the first
	// MaxPrefixBlocks. It keeps the slice until the request is dispatched; the caller must not
	// change it before then.
	Prefix []uint64
	// Subset, when not nil, is the engines (IP:port) the request's destination must be among:
	// the Gateway API Inference Extension's subset hint. Its destination is its decode engine
	// (router.handoff decode), its prefill engine (prefill), or the aggregate fallback; the
	// other engine of a disaggregated request is not bound by it. None of them live and able to
	// be the destination: SubsetUnavailable.
	Subset []string
}

// MaxPrefixBlocks is how many prefix block hashes of an offer the router uses (the leading
// ones): the ext_proc parser hashes no more, and the simulator's offers are cut the same way.
const MaxPrefixBlocks = 32

// Code names a rejection, as the contract's error codes do.
type Code uint8

// Rejection codes.
const (
	WaitingSetFull Code = iota + 1
	PredictedSLOMiss
	FallbackBusy
	NoCapacity
	WaitTimeout
	// ContextLengthExceeded: the prompt, with the request's max_tokens, needs more KV tokens
	// than any engine of the fleet holds; the request could never be placed (a 400, counted
	// as invalid).
	ContextLengthExceeded
	// ShuttingDown: Narwhal is stopping; the request was still waiting when the shutdown grace
	// ran out, or arrived after (a 503 with retry-after).
	ShuttingDown
	// SubsetUnavailable: no engine of the request's subset hint (Offer.Subset) is live and able
	// to be its destination (a 503, as the endpoint picker protocol asks).
	SubsetUnavailable
)

func (c Code) String() string {
	switch c {
	case WaitingSetFull:
		return "waiting_set_full"
	case PredictedSLOMiss:
		return "predicted_slo_miss"
	case FallbackBusy:
		return "fallback_busy"
	case NoCapacity:
		return "no_capacity"
	case WaitTimeout:
		return "wait_timeout"
	case ContextLengthExceeded:
		return "context_length_exceeded"
	case ShuttingDown:
		return "shutting_down"
	case SubsetUnavailable:
		return "subset_unavailable"
	}
	return "unknown"
}

// Status is the HTTP status of a rejection (README).
func (c Code) Status() int {
	switch c {
	case WaitingSetFull, PredictedSLOMiss, FallbackBusy:
		return 429
	case NoCapacity, ShuttingDown, SubsetUnavailable:
		return 503
	case WaitTimeout:
		return 504
	case ContextLengthExceeded:
		return 400
	}
	return 500
}

// Kind says how a request was placed.
type Kind uint8

// Placement kinds.
const (
	Disaggregated Kind = iota + 1 // prefill on one engine, decode on another
	Aggregate                     // both phases on the fallback engine, no handoff
	// Local: both phases on a decode engine, which prefills the prompt itself (chunked beside
	// its decode batch) while prefill engines are live (router.local_prefill). On the wire it
	// is an aggregate placement: no prefiller, the decode engine the destination.
	Local
)

func (k Kind) String() string {
	switch k {
	case Aggregate:
		return "aggregate"
	case Local:
		return "local"
	}
	return "disaggregated"
}

// Why says why a request took its path, as priced at placement (router.local_prefill).
type Why uint8

// Reasons of a placement's path.
const (
	WhyOff    Why = iota // local prefill is off (or the placement is the fallback's)
	WhySooner            // the path taken was projected to give the first token sooner
	WhyAlways            // router.local_prefill: always, and a decode engine had room
	WhyQueued            // local: no prefill engine had room now, and it would start there later
	WhyCost              // disaggregated: local was sooner, by less than the decode time it takes (localCost)
	// Disaggregated for want of a local candidate (the closest one's reason, in this order):
	WhyNoRoom  // no decode engine able to prefill had room for it
	WhyTooLong // more uncached prompt tokens than router.local_prefill_max_tokens
	WhyTPOT    // prefilled locally, the decode engine's residents would miss the TPOT SLO
)

func (w Why) String() string {
	switch w {
	case WhySooner:
		return "sooner"
	case WhyAlways:
		return "always"
	case WhyTooLong:
		return "too_long"
	case WhyNoRoom:
		return "no_room"
	case WhyTPOT:
		return "residents_tpot"
	case WhyQueued:
		return "prefill_queued"
	case WhyCost:
		return "local_cost"
	}
	return "off"
}

// Placement is where a dispatched request goes.
type Placement struct {
	Kind    Kind
	Prefill string // engine id that prefills (the fallback engine for Aggregate)
	Decode  string // engine id that decodes
	// PrefillAddr and DecodeAddr are the engines' IP:port.
	PrefillAddr, DecodeAddr string
	// ProjectedTTFT is the projected time to first token from the request's arrival, seconds.
	ProjectedTTFT float64
	// Why says why it took its path (disaggregated or local); OtherTTFT is the other path's
	// projected time to first token from the arrival, 0 when it was not priced.
	Why       Why
	OtherTTFT float64
}

// Status of an offer or of a request the router reports on.
type Status uint8

// Statuses.
const (
	Waiting    Status = iota + 1 // admitted, in the waiting set: an Output will follow
	Dispatched                   // placed: Placement is set
	Rejected                     // turned away: Code (and RetryAfterS for 429) are set
)

// Outcome is the router's answer to an offer, and each entry of its outbox.
type Outcome struct {
	Handle      Handle
	Status      Status
	Placement   Placement // when Dispatched
	Code        Code      // when Rejected
	RetryAfterS int       // when Rejected with a 429 or ShuttingDown: seconds the client should wait
	// Need and Limit, for ContextLengthExceeded: the KV tokens the request needs (prompt plus
	// max_tokens) and the most any engine of the fleet holds.
	Need, Limit int64
}

// Failure says what a failed request tells of its engine.
type Failure uint8

// Failures.
const (
	// FailRequest: the response was an error that says nothing of the engine's health (a 4xx).
	FailRequest Failure = iota + 1
	// FailUpstream: the engine failed the request (a 5xx, or a reset that Envoy answered with
	// one). health.passive.consecutive_failures of them in a row eject the engine.
	FailUpstream
	// FailUpstreamNoBody: a 5xx without a body. On a disaggregated request sent to its decode
	// engine (router.handoff: decode) it is the prefill leg's: llm-d's P/D sidecar answers a
	// prefiller it could not reach with a bodiless 502, while its own engine's failures carry an
	// error body (docs/interop.md). It counts against the prefill engine then, and as
	// FailUpstream otherwise.
	FailUpstreamNoBody
)

// Ejection is an engine taken out of placement by passive health checking: Failures upstream
// failures in a row on the data path. The router stops placing on it at once; the edge marks
// it failed in the fleet, and the health probes readmit it.
type Ejection struct {
	Engine   string
	Failures int
	AtS      float64 // seconds since the router started
}

// Trigger is an urgent-wake request for the controller: an admitted offer whose projected TTFT
// exceeds slo.ttft_s. The router raises it; coalescing is the controller's job.
type Trigger struct {
	Request       string
	Handle        Handle
	ProjectedTTFT float64
	AtS           float64 // seconds since the router started
}
