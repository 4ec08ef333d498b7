package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func newValidate(stdout io.Writer) *cobra.Command {
	var path, envoyFile string
	cmd := &cobra.Command{
		Use:   "validate [--config FILE] [--envoy FILE]",
		Short: "Validate a config strictly (the embedded default without --config), or an Envoy bootstrap against it",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			if envoyFile != "" {
				return validateEnvoy(stdout, envoyFile, cfg)
			}
			fmt.Fprintln(stdout, "ok")
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "Narwhal config file (YAML)")
	cmd.Flags().StringVar(&envoyFile, "envoy", "", "an Envoy bootstrap (YAML) to validate strictly and against the Narwhal config")
	return cmd
}
