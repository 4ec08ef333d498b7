package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/envoy/bootstrap"
)

func newEnvoyConfig(stdout io.Writer) *cobra.Command {
	var (
		path string
		o    bootstrap.Options
	)
	cmd := &cobra.Command{
		Use:   "envoy-config [--config FILE]",
		Short: "Print a ready Envoy bootstrap (YAML) for a Narwhal config",
		Long: "Prints an Envoy v3 bootstrap for the Narwhal config (the embedded default without\n" +
			"--config): the listener, the ext_proc filter pointed at listen.extproc with a\n" +
			"message_timeout above router.waiting_set.max_wait_s, the ORIGINAL_DST cluster on\n" +
			"x-gateway-destination-endpoint for router.paths, and ADS to listen.xds.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			out, err := bootstrap.Generate(cfg, o)
			if err != nil {
				return usageErr(err)
			}
			_, err = stdout.Write(out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "config", "", "Narwhal config file (YAML)")
	f.StringVar(&o.Listen, "listen", "", "Envoy's HTTP listener (default "+bootstrap.DefaultEnvoyListen+")")
	f.StringVar(&o.Admin, "admin", "", "Envoy's admin interface (default "+bootstrap.DefaultEnvoyAdmin+")")
	f.StringVar(&o.BodyMode, "body-mode", bootstrap.BodyBuffered, "ext_proc request_body_mode: "+bootstrap.BodyBuffered+" or "+bootstrap.BodyFullDuplex)
	f.StringSliceVar(&o.NarwhalHosts, "narwhal-hosts", nil, "host names Envoy reaches Narwhal by (e.g. the compose service name), comma-separated: several for replicas on etcd")
	f.StringSliceVar(&o.NarwhalHosts, "narwhal-host", nil, "the same as --narwhal-hosts, one host")
	f.StringVar(&o.TLS.CAFile, "tls-ca", "", "with tls.extproc or tls.xds: the CA file, as Envoy reads it, that signed Narwhal's certificates")
	f.StringVar(&o.TLS.CertFile, "tls-cert", "", "with a client_ca_file (mutual TLS): Envoy's client certificate file, as Envoy reads it")
	f.StringVar(&o.TLS.KeyFile, "tls-key", "", "with a client_ca_file (mutual TLS): the key of Envoy's client certificate")
	f.IntVar(&o.DiscoveredEngines, "discovered-engines", 0, fmt.Sprintf("engines discovery may add beyond the config's: the circuit breakers are sized for them (0: %d when the config discovers engines)", bootstrap.DefaultDiscoveredEngines))
	return cmd
}

// validateEnvoy checks an Envoy bootstrap strictly and against the Narwhal config.
func validateEnvoy(stdout io.Writer, file string, cfg *config.Config) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return usageErr(fmt.Errorf("--envoy: %w", err))
	}
	problems := bootstrap.Validate(data, cfg)
	if len(problems) == 0 {
		fmt.Fprintln(stdout, "ok")
		return nil
	}
	return usageErr(problems)
}
