package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/narwhal-llm/narwhal/router"
)

// routerCollector exports the router's accounting from one snapshot per scrape, so that the
// metrics obey the same conservation laws as /narwhal/state.
type routerCollector struct {
	src interface{ Snapshot() router.Snapshot }

	offers, invalid, admitted, overflow, dispatched, completed, failed, cancelled, ftTimeouts *prometheus.Desc
	waiting, waitingTokens, prefilling, decoding, awaiting, demand                            *prometheus.Desc
	prefillResidents, decodeResidents, correction                                             *prometheus.Desc
	contextExceeded, ejections, upstreamFailures, ejected                                     *prometheus.Desc
	passedThrough, observed, kvUsage, foreign, unservedLegs, noHandoff                        *prometheus.Desc
	local, localTokens                                                                        *prometheus.Desc
}

// RegisterRouter exports the router's counters, retained demand, demand estimates and engine
// loads with reg.
func RegisterRouter(reg prometheus.Registerer, src interface{ Snapshot() router.Snapshot }) {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("narwhal_"+name, help, labels, nil)
	}
	reg.MustRegister(&routerCollector{
		src:              src,
		offers:           d("offers_total", "Requests on a routed path whose body Narwhal read (or refused for size)."),
		invalid:          d("invalid_total", "Offers answered 400 or 413."),
		admitted:         d("admitted_total", "Offers admitted to the waiting set."),
		overflow:         d("overflow_total", "Offers turned away, by reason.", "reason"),
		dispatched:       d("dispatched_total", "Requests placed, by kind (disaggregated, aggregate: both phases on one engine, the fallback or a local prefill).", "kind"),
		local:            d("local_prefill_total", "Requests placed on a decode engine that prefills them itself (router.local_prefill; in dispatched_total{kind=\"aggregate\"})."),
		localTokens:      d("local_prefill_prompt_tokens_total", "Prompt tokens of the requests prefilled locally on a decode engine."),
		completed:        d("completed_total", "Placed requests that completed."),
		failed:           d("failed_total", "Placed requests that failed (engine error)."),
		cancelled:        d("cancelled_total", "Client cancels, by where the request was (waiting, in_flight).", "where"),
		ftTimeouts:       d("first_token_timeouts_total", "Placed requests with no first token after router.first_token_timeout_s."),
		waiting:          d("waiting", "Requests in the waiting set."),
		waitingTokens:    d("waiting_tokens", "Prompt tokens in the waiting set."),
		prefilling:       d("prefilling", "Placed requests without a first token yet."),
		decoding:         d("decoding", "Placed requests streaming output."),
		awaiting:         d("awaiting_output_tokens", "Expected output tokens of waiting and prefilling requests."),
		demand:           d("demand", "Demand estimates per second, by horizon (short, long, priced) and quantity.", "horizon", "quantity"),
		prefillResidents: d("engine_prefill_residents", "Prefill residents per engine.", "engine"),
		decodeResidents:  d("engine_decode_residents", "Decode residents per engine.", "engine"),
		correction:       d("engine_profile_correction", "Online profile correction factor per engine and phase.", "engine", "phase"),
		contextExceeded:  d("context_length_exceeded_total", "Offers answered 400 context_length_exceeded: no engine of the fleet could hold them (also in invalid)."),
		ejections:        d("passive_ejections_total", "Engines taken out of placement by passive health checking (health.passive)."),
		passedThrough:    d("passed_through_total", "Requests outside router.paths sent to an engine Narwhal picked (behind a GIE gateway every request comes through Narwhal); not offers."),
		upstreamFailures: d("engine_upstream_failures", "Upstream failures in a row on the data path per engine (passive health).", "engine"),
		ejected:          d("engine_ejected", "1 while passive health checking holds the engine out of placement.", "engine"),
		observed:         d("engine_observed_requests", "The requests an engine's own metrics report (health.metrics), by state (running, waiting).", "engine", "state"),
		kvUsage:          d("engine_observed_kv_usage", "The share of its KV cache an engine's own metrics report in use (0..1).", "engine"),
		foreign:          d("engine_foreign_requests", "Requests an engine reports beyond Narwhal's own on it: load the projection counts that did not come through Narwhal.", "engine"),
		unservedLegs:     d("engine_unserved_prefill_legs", "Prefill legs a prefill engine was named for while its finished count stayed flat (the handoff check).", "engine"),
		noHandoff:        d("engine_no_handoff", "1 while a decode engine's prefill engines serve none of its legs: P/D is not happening through it.", "engine"),
	})
}

func (c *routerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.offers, c.invalid, c.admitted, c.overflow, c.dispatched, c.completed,
		c.failed, c.cancelled, c.ftTimeouts, c.waiting, c.waitingTokens, c.prefilling, c.decoding, c.awaiting,
		c.demand, c.prefillResidents, c.decodeResidents, c.correction, c.contextExceeded, c.ejections,
		c.upstreamFailures, c.ejected, c.passedThrough, c.observed, c.kvUsage, c.foreign, c.unservedLegs, c.noHandoff, c.local, c.localTokens} {
		ch <- d
	}
}

func (c *routerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	n := &s.Counters
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.offers, n.Offers)
	counter(c.invalid, n.Invalid)
	counter(c.admitted, n.Admitted)
	counter(c.overflow, n.Overflow.WaitingSetFull, "waiting_set_full")
	counter(c.overflow, n.Overflow.PredictedSLOMiss, "predicted_slo_miss")
	counter(c.overflow, n.Overflow.FallbackBusy, "fallback_busy")
	counter(c.overflow, n.Overflow.NoCapacity, "no_capacity")
	counter(c.overflow, n.Overflow.WaitTimeout, "wait_timeout")
	counter(c.overflow, n.Overflow.ShuttingDown, "shutting_down")
	counter(c.overflow, n.Overflow.SubsetUnavailable, "subset_unavailable")
	counter(c.contextExceeded, n.ContextLengthExceeded)
	counter(c.ejections, n.Ejections)
	counter(c.passedThrough, n.PassedThrough)
	counter(c.dispatched, n.Dispatched.Disaggregated, "disaggregated")
	counter(c.dispatched, n.Dispatched.Aggregate, "aggregate")
	counter(c.local, n.Dispatched.Local)
	counter(c.localTokens, n.LocalPromptTokens)
	counter(c.completed, n.Completed)
	counter(c.failed, n.Failed)
	counter(c.cancelled, n.Cancelled.Waiting, "waiting")
	counter(c.cancelled, n.Cancelled.InFlight, "in_flight")
	counter(c.ftTimeouts, n.FirstTokenTimeouts)
	gauge(c.waiting, float64(s.Retained.Waiting))
	gauge(c.waitingTokens, float64(s.Retained.WaitingTokens))
	gauge(c.prefilling, float64(s.Retained.Prefilling))
	gauge(c.decoding, float64(s.Retained.Decoding))
	gauge(c.awaiting, float64(s.Retained.AwaitingOutputTokens))
	for _, h := range []struct {
		name string
		r    router.Rates
	}{{"short", s.Demand.Short}, {"long", s.Demand.Long}, {"priced", s.Demand.Priced}} {
		gauge(c.demand, h.r.ArrivalsPerS, h.name, "arrivals")
		gauge(c.demand, h.r.PromptTokensPerS, h.name, "prompt_tokens")
		gauge(c.demand, h.r.OutputTokensPerS, h.name, "output_tokens")
	}
	for _, e := range s.Engines {
		gauge(c.prefillResidents, float64(e.PrefillResidents), e.ID)
		gauge(c.decodeResidents, float64(e.DecodeResidents), e.ID)
		gauge(c.correction, e.Correction.Prefill, e.ID, "prefill")
		gauge(c.correction, e.Correction.Decode, e.ID, "decode")
		gauge(c.upstreamFailures, float64(e.Passive.ConsecutiveFailures), e.ID)
		ejected := 0.0
		if e.Passive.Ejected {
			ejected = 1
		}
		gauge(c.ejected, ejected, e.ID)
		if o := e.Observed; o != nil {
			gauge(c.observed, o.Running, e.ID, "running")
			gauge(c.observed, o.Waiting, e.ID, "waiting")
			if o.HasKVUsage {
				gauge(c.kvUsage, o.KVUsage, e.ID)
			}
			gauge(c.foreign, float64(o.Foreign), e.ID)
			gauge(c.unservedLegs, float64(o.UnservedLegs), e.ID)
			no := 0.0
			if o.NoHandoff {
				no = 1
			}
			gauge(c.noHandoff, no, e.ID)
		}
	}
}
