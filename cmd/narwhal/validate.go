package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func newValidate(stdout io.Writer) *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "validate [--config FILE]",
		Short: "Validate a config strictly (the embedded default without --config)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if _, err := loadConfig(path); err != nil {
				return err
			}
			fmt.Fprintln(stdout, "ok")
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "config file (YAML)")
	return cmd
}
