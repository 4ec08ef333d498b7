package config

import _ "embed"

// defaultYAML is the embedded default config: every key with its default value and a
// comment, the default profile, and a four-engine local fleet.
//
//go:embed default.yaml
var defaultYAML string

// Embedded returns a copy of the embedded default config file (default.yaml): a complete,
// commented example of every key, which `narwhal serve` and `narwhal validate` use when no
// --config is given.
func Embedded() []byte { return []byte(defaultYAML) }

// LoadDefault loads and validates the embedded default config.
func LoadDefault() (*Config, error) { return Load(Embedded()) }
