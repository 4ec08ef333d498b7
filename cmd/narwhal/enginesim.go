package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/enginesim"
)

func newEngineSim(g *globalFlags, stderr io.Writer) *cobra.Command {
	var (
		path, listen, profile, role string
		seed                        int64
		maxModelLen                 int
		pdSwitch, pdSwitchFail      bool
		pdSwitchS                   float64
	)
	cmd := &cobra.Command{
		Use:   "enginesim --listen ADDR --profile NAME [--config FILE] [--role R]",
		Short: "Run a simulated OpenAI-compatible model server timed by a profile",
		Long: "Runs a simulated OpenAI-compatible model server (/v1/completions, /v1/chat/completions,\n" +
			"/health, /metrics) whose prefill and decode times follow a profile of the config.\n" +
			"Output-length draws use router.default_output_tokens; prefill noise uses sim.noise_sigma.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := g.logger(stderr)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			p, ok := cfg.Profiles[profile]
			if !ok {
				return usageErr(fmt.Errorf("--profile: unknown profile %q", profile))
			}
			if role != config.RolePrefill && role != config.RoleDecode {
				return usageErr(fmt.Errorf("--role: want prefill or decode, got %q", role))
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			log.Info("enginesim listening", "addr", listen, "profile", profile, "role", role)
			err = enginesim.Run(ctx, listen, enginesim.Options{
				Profile:             p,
				Role:                role,
				Model:               profile,
				NoiseSigma:          cfg.Sim.NoiseSigma,
				Seed:                seed,
				DefaultOutputTokens: cfg.Router.DefaultOutputTokens,
				Logger:              log,
				MaxModelLen:         maxModelLen,
				RoleSwitch:          pdSwitch || pdSwitchFail,
				RoleSwitchS:         pdSwitchS,
				RoleSwitchFail:      pdSwitchFail,
			})
			if err != nil && ctx.Err() == nil {
				return failureErr(err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "address to serve on (host:port)")
	f.StringVar(&profile, "profile", config.DefaultProfileName, "profile name in the config")
	f.StringVar(&path, "config", "", "config file (YAML); the embedded default without it")
	f.StringVar(&role, "role", config.RoleDecode, "role reported by /health (prefill or decode); any phase is served")
	f.Int64Var(&seed, "seed", 1, "seed of the noise and output-length draws")
	f.BoolVar(&pdSwitch, "pd-role-switch", false, "serve SGLang's POST /pd_role_switch (its --enable-pd-role-switch): switch role in place, only while idle")
	f.Float64Var(&pdSwitchS, "pd-role-switch-s", 0.2, "seconds a role switch rebuilds the engine (completions are refused meanwhile)")
	f.BoolVar(&pdSwitchFail, "pd-role-switch-fail", false, "every role switch fails and leaves the engine unhealthy (implies --pd-role-switch)")
	f.IntVar(&maxModelLen, "max-model-len", 0, "context limit (prompt plus output tokens), reported by /v1/models as max_model_len; 0 for none")
	_ = cmd.MarkFlagRequired("listen")
	return cmd
}
