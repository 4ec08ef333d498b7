// Package preflight checks a fleet before it serves (docs/preflight.md): for every engine of a
// config, that it is reachable, healthy, serves a model (the same one as the other engines of its
// profile) and completes a request, and that its prefill and decode speed are those its profile
// says (within ±25%); for every prefill/decode pair placement can make, that a disaggregated
// request through the handoff header works; and, given an Envoy bootstrap, that it fits the
// config. Each check is a row; a fleet passes when every row does.
package preflight

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
	"github.com/narwhal-llm/narwhal/profiler"
	"github.com/narwhal-llm/narwhal/tlsfiles"
	"github.com/narwhal-llm/narwhal/wire"
)

// Tolerance is how far a measured speed may be from its profile's: ±25%.
const Tolerance = 0.25

// Check is one row of the report.
type Check struct {
	Check  string `json:"check"`  // reachable, health, model, completion, prefill_speed, decode_speed, handoff, tls, envoy
	Engine string `json:"engine"` // the engine's id, "P→D" for a pair, the listener for tls, "" for the Envoy bootstrap
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	// Ratio is measured/profile for the speed checks.
	Ratio float64 `json:"ratio,omitempty"`
}

// Options says what to check.
type Options struct {
	Config *config.Config
	// Envoy is an Envoy bootstrap (YAML) to check against the config; nil skips it.
	Envoy []byte
	// Timeout bounds each request (default 30 s).
	Timeout time.Duration
}

// MaxPairs bounds the handoff checks: past it, a subset in which every engine prefills for one
// decoder and decodes for one prefiller at least.
const MaxPairs = 64

// Run runs every check, in order: the engines one after another (their speeds are measured
// alone), then the pairs, then the bootstrap.
func Run(ctx context.Context, o Options) []Check {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	cfg := o.Config
	var out []Check
	add := func(c Check) { out = append(out, c) }
	up := map[string]bool{}
	models := map[string]string{} // profile → the model its first engine serves
	for _, e := range cfg.Engines {
		if engineChecks(ctx, o, e, models, add) {
			up[e.ID] = true
		}
	}
	pairChecks(ctx, o, up, add)
	tlsChecks(cfg, time.Now(), add)
	if o.Envoy != nil {
		ps := bootstrap.Validate(o.Envoy, cfg)
		if len(ps) == 0 {
			add(Check{Check: "envoy", OK: true, Detail: "the bootstrap fits the config"})
		}
		for _, p := range ps {
			add(Check{Check: "envoy", Detail: p.String()})
		}
	}
	return out
}

// engineChecks checks one engine and reports whether it answered a completion.
func engineChecks(ctx context.Context, o Options, e config.Engine, models map[string]string, add func(Check)) bool {
	row := func(check string, ok bool, format string, args ...any) {
		add(Check{Check: check, Engine: e.ID, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	d := net.Dialer{Timeout: 3 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", e.Address)
	if err != nil {
		row("reachable", false, "%s: %v", e.Address, err)
		return false
	}
	conn.Close()
	row("reachable", true, "%s", e.Address)

	base := "http://" + e.Address
	client := &http.Client{Timeout: o.Timeout}
	path := o.Config.Health.Path
	if resp, err := client.Get(base + path); err != nil {
		row("health", false, "GET %s: %v", path, err)
	} else {
		resp.Body.Close()
		row("health", resp.StatusCode/100 == 2, "GET %s: %s", path, resp.Status)
	}

	probe, err := profiler.NewEngine(base, "")
	if err != nil {
		row("model", false, "%v", err)
		return false
	}
	probe.HTTP.Timeout = o.Timeout
	served, err := probe.Models(ctx)
	switch {
	case err != nil:
		row("model", false, "%v", err)
		return false
	case len(served.Models) == 0:
		row("model", false, "GET /v1/models lists no model")
		return false
	}
	probe.Model = served.Models[0]
	if want, ok := models[e.Profile]; ok && want != probe.Model && !slices.Contains(served.Models, want) {
		row("model", false, "serves %s, but the other engines of profile %s serve %s", probe.Model, e.Profile, want)
	} else {
		if ok {
			probe.Model = want
		}
		models[e.Profile] = probe.Model
		row("model", true, "serves %s", probe.Model)
	}

	begin := time.Now()
	tr, err := probe.Stream(ctx, profiler.Request{Prompt: "Say hello.", MaxTokens: 1})
	if err != nil || len(tr.Tokens) == 0 {
		row("completion", false, "a one-token completion: %v", orNoToken(err))
		return false
	}
	row("completion", true, "a one-token completion in %s", time.Since(begin).Round(time.Millisecond))

	speeds(ctx, probe, o.Config.Profiles[e.Profile], e, add)
	return true
}

func orNoToken(err error) error {
	if err == nil {
		return fmt.Errorf("the stream carried no token")
	}
	return err
}

// speeds measures prefill (the fastest of three at each of two lengths: what a busy machine adds only adds time) and decode (four streams)
// against the engine's profile.
func speeds(ctx context.Context, e *profiler.Engine, prof config.Profile, ce config.Engine, add func(Check)) {
	row := func(check string, ratio float64, format string, args ...any) {
		ok := ratio >= 1-Tolerance && ratio <= 1+Tolerance
		add(Check{Check: check, Engine: ce.ID, OK: ok, Ratio: ratio, Detail: fmt.Sprintf(format, args...)})
	}
	p, err := profiler.NewProbe(ctx, e)
	if err != nil {
		add(Check{Check: "prefill_speed", Engine: ce.ID, Detail: err.Error()})
		return
	}
	if c := prof.Prefill; c != nil {
		worst, at := 1.0, ""
		for _, n := range slices.Compact([]int{min(1024, c.MaxTokens), min(4096, c.MaxTokens)}) {
			best := profiler.PrefillPoint{}
			for range 3 {
				pt, err := p.Prefill(ctx, n)
				if err != nil {
					add(Check{Check: "prefill_speed", Engine: ce.ID, Detail: fmt.Sprintf("a %d-token prefill: %v", n, err)})
					return
				}
				if best.TTFTS == 0 || pt.TTFTS < best.TTFTS {
					best = pt
				}
			}
			want := c.Seconds(best.PromptTokens)
			if r := best.TTFTS / want; abs(r-1) >= abs(worst-1) {
				worst, at = r, fmt.Sprintf("%.4f s for %d tokens, the profile %.4f s", best.TTFTS, best.PromptTokens, want)
			}
		}
		row("prefill_speed", worst, "%.2f× the profile: %s", worst, at)
	}
	if c := prof.Decode; c != nil {
		d, err := p.Decode(ctx, 4, 256, 32)
		if err != nil {
			add(Check{Check: "decode_speed", Engine: ce.ID, Detail: fmt.Sprintf("4 streams: %v", err)})
			return
		}
		want := c.StepSeconds(d.Streams, d.KVTokens)
		r := d.StepS / want
		row("decode_speed", r, "%.2f× the profile: a step of %.5f s with %d streams and %d KV tokens, the profile %.5f s", r, d.StepS, d.Streams, d.KVTokens, want)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// pairChecks sends a disaggregated request through each prefill/decode pair placement can make
// among the engines that answered: with router.handoff decode, to the decode engine naming the
// prefiller (it pulls the KV); with prefill, to the prefill engine naming the decoder.
func pairChecks(ctx context.Context, o Options, up map[string]bool, add func(Check)) {
	cfg := o.Config
	moves := !cfg.Controller.Advisory // the controller may give any engine not pinned either role
	can := func(e config.Engine, role string) bool {
		return up[e.ID] && (e.Role == role || moves && !e.Pinned && e.CanPlay(role))
	}
	type pair struct{ p, d config.Engine }
	var all []pair
	for _, p := range cfg.Engines {
		for _, d := range cfg.Engines {
			if p.ID != d.ID && can(p, config.RolePrefill) && can(d, config.RoleDecode) {
				all = append(all, pair{p, d})
			}
		}
	}
	pairs := all
	if len(all) > MaxPairs { // every engine once each way, then as many more as fit
		pairs = nil
		asP, asD := map[string]bool{}, map[string]bool{}
		for _, x := range all {
			if !asP[x.p.ID] || !asD[x.d.ID] {
				pairs = append(pairs, x)
				asP[x.p.ID], asD[x.d.ID] = true, true
			}
		}
		add(Check{Check: "handoff", OK: true, Detail: fmt.Sprintf("%d pairs can be made; %d checked, every engine in each role at least once", len(all), len(pairs))})
	}
	for _, x := range pairs {
		to, named, header := x.d, x.p, wire.HeaderPrefiller
		if cfg.Router.Handoff == config.HandoffPrefill {
			to, named, header = x.p, x.d, wire.HeaderDecode
		}
		e, _ := profiler.NewEngine("http://"+to.Address, "")
		e.HTTP.Timeout = o.Timeout
		served, err := e.Models(ctx)
		if err == nil && len(served.Models) > 0 {
			e.Model = served.Models[0]
		}
		h := http.Header{}
		h.Set(header, named.Address)
		id := x.p.ID + "→" + x.d.ID
		// The named engine's side proves the handoff: it finishes a request (its leg) for each
		// one sent through the other. An engine that ignores the header answers the request
		// whole, and the answer alone cannot tell.
		other, _ := profiler.NewEngine("http://"+named.Address, "")
		other.HTTP.Timeout = o.Timeout
		before, berr := other.Metrics(ctx)
		tr, err := e.Stream(ctx, profiler.Request{Prompt: "The handoff check says hello.", MaxTokens: 2, Header: h})
		if err != nil || len(tr.Tokens) == 0 {
			add(Check{Check: "handoff", Engine: id, Detail: fmt.Sprintf("POST /v1/completions to %s with %s: %s: %v", to.ID, header, named.Address, orNoToken(err))})
			continue
		}
		after, aerr := other.Metrics(ctx)
		switch {
		case berr != nil || aerr != nil || !before.HasFinished || !after.HasFinished:
			add(Check{Check: "handoff", Engine: id, OK: true, Detail: fmt.Sprintf("%s answered with %s: %s (%d tokens); not proven on %s's side: it reports no vllm:request_success_total", to.ID, header, named.Address, len(tr.Tokens), named.ID)})
		case after.Finished <= before.Finished:
			add(Check{Check: "handoff", Engine: id, Detail: fmt.Sprintf("%s answered with %s: %s, but %s served no leg of it (vllm:request_success_total stayed at %g): %s did the whole request itself — with router.handoff decode, address the decode engine's P/D sidecar, not the engine (docs/preflight.md)", to.ID, header, named.Address, named.ID, after.Finished, to.ID)})
		default:
			add(Check{Check: "handoff", Engine: id, OK: true, Detail: fmt.Sprintf("%s answered with %s: %s (%d tokens), and %s served its leg", to.ID, header, named.Address, len(tr.Tokens), named.ID)})
		}
	}
}

// MinCertLife is how long a listener's certificate must still be valid for its tls check to
// pass: renew it before.
const MinCertLife = 7 * 24 * time.Hour

// tlsChecks loads every listener's certificate files as serve would (tls.*) and checks that the
// certificate is valid now and for MinCertLife more.
func tlsChecks(cfg *config.Config, now time.Time, add func(Check)) {
	for _, l := range []struct {
		name string
		t    config.ListenerTLS
	}{{"extproc", cfg.TLS.ExtProc}, {"xds", cfg.TLS.XDS}, {"admin", cfg.TLS.Admin}} {
		if !l.t.Enabled() {
			continue
		}
		s, err := tlsfiles.NewServer("tls."+l.name, tlsfiles.Files{CertFile: l.t.CertFile, KeyFile: l.t.KeyFile, ClientCAFile: l.t.ClientCAFile}, nil)
		if err != nil {
			add(Check{Check: "tls", Engine: l.name, Detail: err.Error()})
			continue
		}
		st := s.Status()
		left := st.NotAfter.Sub(now)
		mutual := ""
		if st.Mutual {
			mutual = ", clients need a certificate from " + l.t.ClientCAFile
		}
		switch {
		case left <= 0:
			add(Check{Check: "tls", Engine: l.name, Detail: fmt.Sprintf("%s (%s) expired %s ago", l.t.CertFile, st.Subject, (-left).Round(time.Minute))})
		case left < MinCertLife:
			add(Check{Check: "tls", Engine: l.name, Detail: fmt.Sprintf("%s (%s) expires in %s: renew it", l.t.CertFile, st.Subject, left.Round(time.Minute))})
		default:
			add(Check{Check: "tls", Engine: l.name, OK: true, Detail: fmt.Sprintf("%s (%s) valid %d more days%s", l.t.CertFile, st.Subject, int(left.Hours()/24), mutual)})
		}
	}
}
