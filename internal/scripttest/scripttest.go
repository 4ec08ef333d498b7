// Package scripttest is what the router's and the controller's datadriven scripts share
// (cockroachdb/datadriven): virtual time that never goes back, a fleet and the router over it,
// requests by name, and the commands that drive them. Each package's driver embeds Driver and
// adds its own commands.
package scripttest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/fleet"
	"github.com/narwhal-llm/narwhal/router"
)

// Epoch is time 0 of every script: at=S is S seconds after it.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Driver holds the shared state of a script. Start sets it up at init.
type Driver struct {
	T      testing.TB
	Fleet  *fleet.Fleet
	Router *router.Router
	Now    time.Time
	// Handles and Names map a script's request ids to the router's handles and back.
	Handles map[string]router.Handle
	Names   map[router.Handle]string
	prefix  map[string]uint64 // prefix block name → id
	added   int               // engines added (their addresses)
}

// Start begins a script on a fleet and a router over it, at Epoch.
func (d *Driver) Start(t testing.TB, f *fleet.Fleet, r *router.Router) {
	*d = Driver{T: t, Fleet: f, Router: r, Now: Epoch, Handles: map[string]router.Handle{}, Names: map[router.Handle]string{}, prefix: map[string]uint64{}}
}

// At reads the command's at=S, if any, and returns the script's time; time going back fails the
// test.
func (d *Driver) At(td *datadriven.TestData) time.Time {
	if td.HasArg("at") {
		var s float64
		td.ScanArgs(d.T, "at", &s)
		at := Epoch.Add(time.Duration(s * float64(time.Second)))
		if at.Before(d.Now) {
			d.T.Fatalf("%s: time goes back to %vs", td.Pos, s)
		}
		d.Now = at
	}
	return d.Now
}

// Run runs td if it is a shared command and reports whether it was one:
//
//	offer id=r1 tokens=N [max=N] [nostream] [prefix=a,b,c] [subset=e1,e2|-] [at=S]
//	first id=r1 [at=S]      complete id=r1 [tokens=N] [at=S]
//	fail id=r1 [upstream] [at=S]        cancel id=r1 [at=S]
//	lifecycle id=e1 to=failed|draining|recovering|active [sight=unconfirmed|blind] [at=S]
//	role id=e3 to=prefill|decode [at=S]  (a role change made outside any controller)
//	add id=e4 role=prefill|decode|open [at=S]   (joins recovering: bring it up with lifecycle)
//	remove id=e3 [at=S]
//
// An offer prints its outcome; a refused call prints its error.
func (d *Driver) Run(td *datadriven.TestData, b *strings.Builder) bool {
	switch td.Cmd {
	case "offer":
		d.offer(td, b)
	case "first", "complete", "fail", "cancel":
		d.request(td, b)
	case "lifecycle", "role", "add", "remove":
		d.fleetChange(td, b)
	default:
		return false
	}
	return true
}

func (d *Driver) offer(td *datadriven.TestData, b *strings.Builder) {
	var id string
	o := router.Offer{}
	td.ScanArgs(d.T, "id", &id)
	td.ScanArgs(d.T, "tokens", &o.PromptTokens)
	td.MaybeScanArgs(d.T, "max", &o.MaxTokens)
	o.NonStreaming = td.HasArg("nostream")
	o.ID = id
	if td.HasArg("prefix") {
		var p string
		td.ScanArgs(d.T, "prefix", &p)
		var h uint64
		for _, blk := range strings.Split(p, ",") {
			h = h*1000003 ^ uint64(len(blk)) ^ d.blockID(blk)
			o.Prefix = append(o.Prefix, h)
		}
	}
	o.Subset = d.Subset(td)
	out := d.Router.Offer(d.At(td), o)
	if out.Handle != 0 {
		d.Handles[id], d.Names[out.Handle] = out.Handle, id
	}
	b.WriteString(Outcome(id, out))
}

// Subset reads a subset hint, subset=e1,e2 (engine ids; "-" for an empty hint), as the
// engines' addresses; nil without the argument.
func (d *Driver) Subset(td *datadriven.TestData) []string {
	if !td.HasArg("subset") {
		return nil
	}
	var ids string
	td.ScanArgs(d.T, "subset", &ids)
	out := []string{}
	for _, id := range strings.Split(ids, ",") {
		if e, ok := d.Fleet.Engine(id); ok {
			out = append(out, e.Addr)
		}
	}
	return out
}

func (d *Driver) blockID(s string) uint64 {
	if v, ok := d.prefix[s]; ok {
		return v
	}
	d.prefix[s] = uint64(len(d.prefix) + 1)
	return d.prefix[s]
}

func (d *Driver) request(td *datadriven.TestData, b *strings.Builder) {
	var id string
	td.ScanArgs(d.T, "id", &id)
	h, ok := d.Handles[id]
	if !ok {
		d.T.Fatalf("%s: no request %s", td.Pos, id)
	}
	now := d.At(td)
	var err error
	switch td.Cmd {
	case "first":
		err = d.Router.FirstToken(now, h)
	case "complete":
		n := 0
		td.MaybeScanArgs(d.T, "tokens", &n)
		err = d.Router.Complete(now, h, n)
	case "fail":
		why := router.FailRequest
		switch {
		case td.HasArg("upstream") && td.HasArg("nobody"):
			why = router.FailUpstreamNoBody
		case td.HasArg("upstream"):
			why = router.FailUpstream
		}
		err = d.Router.Fail(now, h, why)
	case "cancel":
		err = d.Router.Cancel(now, h)
	}
	if err != nil {
		fmt.Fprintf(b, "error: %v\n", err)
	}
}

func (d *Driver) fleetChange(td *datadriven.TestData, b *strings.Builder) {
	var id, to string
	td.ScanArgs(d.T, "id", &id)
	if td.Cmd == "lifecycle" || td.Cmd == "role" {
		td.ScanArgs(d.T, "to", &to)
	}
	now := d.At(td)
	var err error
	switch td.Cmd {
	case "add":
		var role string
		td.ScanArgs(d.T, "role", &role)
		if role == "open" {
			role = ""
		}
		d.added++
		_, err = d.Fleet.Add(config.Engine{ID: id, Address: fmt.Sprintf("10.0.1.%d:8000", d.added), Role: role, Profile: config.DefaultProfileName}, "test", now)
	case "remove":
		_, err = d.Fleet.Remove(id, now, "test")
	case "role":
		role, perr := fleet.ParseRole(to)
		if perr != nil {
			d.T.Fatalf("%s: %v", td.Pos, perr)
		}
		_, err = d.Fleet.SetRole(id, role, now, "test")
	default:
		l, ok := lifecycle(to)
		if !ok {
			d.T.Fatalf("%s: unknown lifecycle %q", td.Pos, to)
		}
		if td.HasArg("sight") { // readmitted by probes that never saw the data path's failure
			var v string
			td.ScanArgs(d.T, "sight", &v)
			sight, known := map[string]fleet.Sight{"unconfirmed": fleet.SightUnconfirmed, "blind": fleet.SightBlind}[v]
			if !known {
				d.T.Fatalf("%s: unknown sight %q", td.Pos, v)
			}
			_, err = d.Fleet.Readmit(id, now, "test", sight)
		} else {
			_, err = d.Fleet.SetLifecycle(id, l, now, "test")
		}
	}
	if err != nil {
		fmt.Fprintf(b, "error: %v\n", err)
		return
	}
	d.Router.SetFleet(now, d.Fleet.Snapshot())
}

func lifecycle(name string) (fleet.Lifecycle, bool) {
	for _, l := range fleet.Lifecycles {
		if l.String() == name {
			return l, true
		}
	}
	return 0, false
}

// Outcome is one line of a request's outcome: waiting, dispatched (where, projected TTFT) or
// rejected (status, code, retry-after, the context limit).
func Outcome(id string, o router.Outcome) string {
	switch o.Status {
	case router.Waiting:
		return fmt.Sprintf("%s: waiting\n", id)
	case router.Dispatched:
		p := o.Placement
		var why string
		if p.Why != router.WhyOff {
			why = " why=" + p.Why.String()
		}
		if p.OtherTTFT > 0 {
			why += fmt.Sprintf(" other=%.3f", p.OtherTTFT)
		}
		if p.Kind != router.Disaggregated {
			return fmt.Sprintf("%s: dispatched %s on %s ttft=%.3f%s\n", id, p.Kind, p.Prefill, p.ProjectedTTFT, why)
		}
		return fmt.Sprintf("%s: dispatched prefill=%s decode=%s ttft=%.3f%s\n", id, p.Prefill, p.Decode, p.ProjectedTTFT, why)
	case router.Rejected:
		s := fmt.Sprintf("%s: rejected %d %s", id, o.Code.Status(), o.Code)
		if o.RetryAfterS > 0 {
			s += fmt.Sprintf(" retry-after=%d", o.RetryAfterS)
		}
		if o.Code == router.ContextLengthExceeded {
			s += fmt.Sprintf(" need=%d limit=%d", o.Need, o.Limit)
		}
		return s + "\n"
	}
	return fmt.Sprintf("%s: status %d\n", id, o.Status)
}

// Output prints what the router raised (outcomes by request id, ejections, the urgent trigger),
// acknowledges it, and returns it.
func (d *Driver) Output(b *strings.Builder) router.Output {
	var out router.Output
	d.Router.Take(&out)
	for _, o := range out.Outcomes {
		b.WriteString(Outcome(d.Names[o.Handle], o))
	}
	for _, e := range out.Ejections {
		fmt.Fprintf(b, "ejected: %s after %d upstream failures\n", e.Engine, e.Failures)
	}
	if out.Urgent {
		fmt.Fprintf(b, "urgent: %s projected_ttft=%.3f\n", out.Trigger.Request, out.Trigger.ProjectedTTFT)
	}
	return out
}
