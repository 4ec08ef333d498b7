package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/problem"
)

// Load decodes a YAML config strictly onto Default() and validates it.
//
// A missing key keeps its default; an explicit null (or an empty value) also keeps the
// default, except for a profile's prefill or decode curve, where null means "no curve".
// Lists replace their default. Profiles merge by name: a profile under an existing name
// (DefaultProfileName) overrides only the keys it sets. A new profile starts with the
// default profile's prefill_concurrency and kv_transfer_s, a new curve with its max_tokens,
// max_streams and max_kv_tokens, and a new engine with profile DefaultProfileName. Anchors,
// aliases and merge keys ("<<") are understood.
//
// On any problem Load returns a nil Config and an problem.List listing all of them: decoding
// problems (unknown or duplicate keys, wrong types, syntax) in document order, then the
// Validate problems, leaving out those that only follow from a value that failed to decode.
func Load(data []byte) (*Config, error) {
	cfg, res := decode(data)
	problems := res.problems
	if !res.fatal {
		problems = append(problems, cfg.check().visible(res.tainted)...)
	}
	if len(problems) > 0 {
		return nil, problem.List(problems)
	}
	return cfg, nil
}

// LoadFile reads the file at path and Loads it. A file that cannot be read gives a plain
// error naming the file; a file that can be read but is invalid gives problem.List.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: cannot read config file: %w", err)
	}
	return Load(data)
}

// decodeResult is what decoding found besides the Config: problems in document order, the
// paths whose values could not be decoded (validation stays silent about them, to avoid
// cascades), and whether the document could not be decoded at all.
type decodeResult struct {
	problems []problem.Problem
	tainted  []string
	fatal    bool
}

// decode parses data and decodes it onto Default(), without validating.
func decode(data []byte) (*Config, decodeResult) {
	cfg := Default()
	root, err := parse(data)
	if err != nil {
		return cfg, decodeResult{problems: []problem.Problem{{Msg: err.Error()}}, fatal: true}
	}
	if root == nil {
		return cfg, decodeResult{}
	}
	d := newDecoder(root)
	d.document(root, cfg)
	return cfg, decodeResult{problems: d.problems, tainted: d.tainted, fatal: d.exhausted}
}

// parse reads exactly one YAML document into a node tree; nil means an empty document.
func parse(data []byte) (root *yaml.Node, err error) {
	defer func() {
		// The parser reports its own errors as values; this only guards against a bug in
		// it turning arbitrary input into a crash.
		if r := recover(); r != nil {
			root, err = nil, fmt.Errorf("syntax error: the YAML parser failed: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, syntaxError(err)
	default:
		return nil, fmt.Errorf("syntax error: line %d: a second YAML document; a config is one document", next.Line)
	}
	return &doc, nil
}

// syntaxError rewords a parser error ("yaml: line 3: ...") as one problem line.
func syntaxError(err error) error {
	return errors.New("syntax error: " + strings.TrimPrefix(err.Error(), "yaml: "))
}
