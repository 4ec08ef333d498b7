package router

// The router's output to its edge.

// Output is what the router raised since the last Take for its edge to act on: the one
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

// Take moves the output raised since the last Take into out and the router forgets it: out's
// slices are reused (nothing is allocated once they have grown), so that the caller may act on
// out while it calls into the router again. It is the router's one output: the live wrapper,
// the simulator and the scripts take it so.
func (r *Router) Take(out *Output) {
	out.Outcomes = append(out.Outcomes[:0], r.outbox...)
	out.Ejections = append(out.Ejections[:0], r.ejections...)
	out.Trigger, out.Urgent = r.trigger, r.urgent
	r.outbox, r.ejections, r.urgent = r.outbox[:0], r.ejections[:0], false
}
