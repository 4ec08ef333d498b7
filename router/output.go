package router

// The router's output to its edge.

// Output is what the router raised since the last Advance for its edge to act on: the one
// value that leaves it besides the answers of its calls.
type Output struct {
	// Outcomes are the dispatches and rejections of waiting requests, in order.
	Outcomes []Outcome
	// Trigger is the urgent-wake trigger, when Urgent: the first admitted offer whose projected
	// TTFT exceeded slo.ttft_s (for the controller).
	Trigger Trigger
	Urgent  bool
	// Ejections are the engines passive health checking took out (for the fleet: failed).
	Ejections []Ejection
}

// Empty reports whether there is nothing to act on.
func (o Output) Empty() bool { return len(o.Outcomes) == 0 && !o.Urgent && len(o.Ejections) == 0 }

// Ready returns the output raised since the last Advance. Its slices are the router's own:
// take what is needed, then call Advance before any other call into the router.
func (r *Router) Ready() Output {
	return Output{Outcomes: r.outbox, Trigger: r.trigger, Urgent: r.urgent, Ejections: r.ejections}
}

// Advance acknowledges the output Ready returned: the router forgets it (and reuses its
// storage).
func (r *Router) Advance() {
	r.outbox, r.ejections, r.urgent = r.outbox[:0], r.ejections[:0], false
}
