package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
	"github.com/narwhal-llm/narwhal/gateway"
	"github.com/narwhal-llm/narwhal/load"
	"github.com/narwhal-llm/narwhal/profiler"
	"github.com/narwhal-llm/narwhal/sim"
	"github.com/narwhal-llm/narwhal/tlsfiles"
)

func newLoad(stdout, stderr io.Writer) *cobra.Command {
	var (
		cfgPath, extproc, adminURL, listen, bodyMode, model, reportPath string
		tlsCA, tlsCert, tlsKey                                          string
		durationS, everyS, waitS                                        float64
		wl                                                              workload
	)
	cmd := &cobra.Command{
		Use:   "load (--trace FILE | --synthetic KIND) [--config FILE] [--listen ADDR]",
		Short: "Replay a workload in real time through a running narwhal serve and its engines, playing Envoy's part",
		Long: "Replays a trace or a synthetic workload (the sim's, same flags) in real time through a running\n" +
			"`narwhal serve`: each request goes to Narwhal's ext_proc server as the Envoy of `narwhal\n" +
			"envoy-config` would send it, then to the engine Narwhal names, and its response back through\n" +
			"ext_proc. A progress line every --every-s (sent, answered, TTFT, attainment against the\n" +
			"config's SLO, the split) and each role change are printed to stderr; a summary to stdout.\n" +
			"--listen serves the same gateway to other clients (curl) while the run lasts.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cfgPath)
			if err != nil {
				return err
			}
			reqs, _, _, err := wl.requests("load", true)
			if err != nil {
				return err
			}
			if durationS > 0 { // the requests come sorted by arrival
				reqs = reqs[:sort.Search(len(reqs), func(i int) bool { return reqs[i].ArrivalS >= durationS })]
			}
			if extproc == "" {
				extproc = loopback(cfg.Listen.ExtProc)
			}
			// The filter of the bootstrap envoy-config writes for this config, pointed at the
			// ext_proc server played against (the addresses shape the clusters, not the filter;
			// a listener on port 0 has none to write).
			bc := *cfg
			bc.Listen.ExtProc, bc.Listen.XDS = extproc, extproc
			filter, limit, err := bootstrap.ExtProcFilter(&bc, bootstrap.Options{BodyMode: bodyMode})
			if err != nil {
				return usageErr(err)
			}
			mode, err := gateway.ModeOf(filter, limit)
			if err != nil {
				return failureErr(err)
			}
			if adminURL == "" {
				scheme := "http://"
				if cfg.TLS.Admin.Enabled() {
					scheme = "https://"
				}
				adminURL = scheme + loopback(cfg.Listen.Admin)
			}
			var extTLS, adminTLS *tls.Config // the client side of tls.extproc and tls.admin
			if cfg.TLS.ExtProc.Enabled() || cfg.TLS.Admin.Enabled() {
				tc, err := tlsfiles.Client("load: --tls-ca, --tls-cert, --tls-key", tlsCA, tlsCert, tlsKey)
				if err != nil {
					return usageErr(err)
				}
				if cfg.TLS.ExtProc.Enabled() {
					extTLS = tc
				}
				if cfg.TLS.Admin.Enabled() {
					adminTLS = tc
				}
			} else if tlsCA != "" || tlsCert != "" || tlsKey != "" {
				return usageErr(errors.New("load: --tls-* given but the config serves no TLS (tls.extproc, tls.admin)"))
			}
			if !cmd.Flags().Changed("model") {
				model = servedModel(cmd.Context(), cfg, stderr)
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return failureErr(fmt.Errorf("load: --listen: %w", err))
			}
			fmt.Fprintf(stderr, "load: %d requests of %s over %.0f s through Narwhal's ext_proc at %s (request body %s); gateway on http://%s\n",
				len(reqs), wl.name(), lastArrival(reqs), extproc, filter.GetProcessingMode().GetRequestBodyMode(), lis.Addr())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sum, err := load.Run(ctx, reqs, load.Options{
				ExtProc: extproc, Mode: mode, Paths: cfg.Router.Paths, Admin: adminURL, ReadyWait: time.Duration(waitS * float64(time.Second)),
				ExtProcTLS: extTLS, AdminTLS: adminTLS,
				TTFTS: cfg.SLO.TTFTS, TPOTS: cfg.SLO.TPOTS, Model: model,
				Every: time.Duration(everyS * float64(time.Second)), Progress: stderr, Listener: lis,
			})
			if err != nil {
				return failureErr(err)
			}
			sum.WriteTable(stdout)
			if err := writeOut(reportPath, nil, func(w io.Writer) error { return writeJSON(w, sum) }); err != nil {
				return err
			}
			if sum.Sent > 0 && sum.Answered == 0 {
				return failureErr(fmt.Errorf("load: none of the %d requests was answered: is narwhal serve running with ext_proc on %s?", sum.Sent, extproc))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", "", "the config narwhal serve runs (default: the embedded one): its listen addresses, router.paths and SLO")
	f.StringVar(&extproc, "extproc", "", "Narwhal's ext_proc address (default: the config's listen.extproc)")
	f.StringVar(&adminURL, "admin", "", "Narwhal's admin URL, for the split and role changes (default: the config's listen.admin, https:// with tls.admin)")
	f.StringVar(&tlsCA, "tls-ca", "", "with tls.extproc (and tls.admin): the CA file that signed Narwhal's certificates (default: the system's roots)")
	f.StringVar(&tlsCert, "tls-cert", "", "with mutual TLS: the client certificate presented to Narwhal")
	f.StringVar(&tlsKey, "tls-key", "", "with mutual TLS: the client certificate's key")
	f.StringVar(&listen, "listen", "127.0.0.1:0", "where the gateway also serves other clients while the run lasts (host:port)")
	f.StringVar(&bodyMode, "body-mode", bootstrap.BodyBuffered, "the ext_proc request_body_mode played: "+bootstrap.BodyBuffered+" or "+bootstrap.BodyFullDuplex)
	f.StringVar(&model, "model", "", "the requests' model field (default: the first model the config's first engine that answers GET /v1/models serves, else "+defaultLoadModel+")")
	f.StringVar(&reportPath, "report", "", "write the summary as JSON here")
	f.Float64Var(&durationS, "duration-s", 0, "replay the first N seconds of the workload (after --rate-scale; 0: all)")
	f.Float64Var(&everyS, "every-s", 5, "seconds between progress lines")
	f.Float64Var(&waitS, "wait-s", 30, "wait up to N seconds for Narwhal's /readyz before the first request (0: do not wait)")
	wl.bind(f, "seed of the synthetic workload and of --spread-s")
	return cmd
}

// loopback is a listen address as a client reaches it: a host that means every interface
// (empty, 0.0.0.0, ::) becomes the loopback address.
func loopback(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// lastArrival is the last request's arrival, seconds.
func lastArrival(reqs []sim.Request) float64 {
	if len(reqs) == 0 {
		return 0
	}
	return reqs[len(reqs)-1].ArrivalS
}

// defaultLoadModel is load's model when no engine of the config says what it serves.
const defaultLoadModel = "narwhal-demo"

// servedModel is the model load's requests name when --model is not given: the first one the
// first engine of the config that answers GET /v1/models serves (an engine answers 404 to a
// model it does not serve, as vLLM and llm-d's emulator do), said on stderr; defaultLoadModel
// when none of the first three answers (each asked for 2 s at most).
func servedModel(ctx context.Context, cfg *config.Config, stderr io.Writer) string {
	for _, e := range cfg.Engines[:min(len(cfg.Engines), 3)] {
		probe, err := profiler.NewEngine("http://"+e.Address, "")
		if err != nil {
			continue
		}
		probe.HTTP.Timeout = 2 * time.Second
		if s, err := probe.Models(ctx); err == nil && len(s.Models) > 0 {
			fmt.Fprintf(stderr, "load: model %s (GET /v1/models of engine %s; --model sets another)\n", s.Models[0], e.ID)
			return s.Models[0]
		}
	}
	fmt.Fprintf(stderr, "load: no engine of the config answered GET /v1/models: model %s (--model sets another)\n", defaultLoadModel)
	return defaultLoadModel
}
