package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/problem"
)

// twoEngines is the smallest valid fleet for the default floors.
const twoEngines = `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill}
  - {id: e2, address: "127.0.0.1:8002", role: decode}
`

// fourEngines is the embedded default's fleet.
func fourEngines() []Engine {
	e := func(id, addr, role string) Engine {
		return Engine{ID: id, Address: addr, Role: role, Profile: DefaultProfileName, Switch: SwitchRouting, Roles: []string{}}
	}
	return []Engine{
		e("e1", "127.0.0.1:8001", RolePrefill),
		e("e2", "127.0.0.1:8002", RolePrefill),
		e("e3", "127.0.0.1:8003", RoleDecode),
		e("e4", "127.0.0.1:8004", RoleDecode),
	}
}

// problemsOf asserts that err is an problem.List and returns it.
func problemsOf(t *testing.T, err error) problem.List {
	t.Helper()
	var errs problem.List
	if !errors.As(err, &errs) {
		t.Fatalf("error %v (%T) is not config.problem.List", err, err)
	}
	return errs
}

func mustLoad(t *testing.T, src string) *Config {
	t.Helper()
	cfg, err := Load([]byte(src))
	if err != nil {
		t.Fatalf("Load: unexpected error:\n%v", err)
	}
	return cfg
}

func TestEmbeddedDefault(t *testing.T) {
	cfg, err := LoadDefault()
	if err != nil {
		t.Fatalf("LoadDefault: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	want := Default()
	want.Engines = fourEngines()
	want.Sim.Faults = []Fault{} // the file says `faults: []`
	if !reflect.DeepEqual(cfg, want) {
		got, _ := json.MarshalIndent(cfg, "", " ")
		exp, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("embedded default differs from Default() plus four engines:\n got %s\nwant %s", got, exp)
	}
	if p := cfg.Profiles[DefaultProfileName]; !reflect.DeepEqual(p, DefaultProfile()) {
		t.Errorf("default profile = %+v %+v %+v, want the values in defaults.go", p, *p.Prefill, *p.Decode)
	}
	if got, want := string(Embedded()), defaultYAML; got != want {
		t.Errorf("Embedded() differs from the embedded file")
	}
	b := Embedded()
	b[0] = '!'
	if Embedded()[0] == '!' {
		t.Errorf("Embedded() returns shared bytes")
	}
}

func parseDefaultYAML(t *testing.T) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(Embedded(), &doc); err != nil {
		t.Fatalf("parse default.yaml: %v", err)
	}
	return doc.Content[0]
}

// lookup returns the value of key in a mapping node, and the key node.
func lookup(n *yaml.Node, key string) (val, k *yaml.Node) {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1], n.Content[i]
		}
	}
	return nil, nil
}

// leafPaths walks typ and the YAML node n together and reports every schema leaf missing
// from n. A map is looked up under DefaultProfileName; an empty list of structs must name
// each of its keys in the comment on the list.
func checkComplete(t *testing.T, typ reflect.Type, n *yaml.Node, key *yaml.Node, path string, leaves *int) {
	t.Helper()
	switch typ.Kind() {
	case reflect.Pointer:
		checkComplete(t, typ.Elem(), n, key, path, leaves)
	case reflect.Struct:
		names, index := fields(typ)
		for _, name := range names {
			val, k := lookup(n, name)
			p := problem.Key(path, name)
			if val == nil {
				t.Errorf("default.yaml lacks %s", p)
				continue
			}
			checkComplete(t, typ.Field(index[name]).Type, val, k, p, leaves)
		}
	case reflect.Map:
		val, k := lookup(n, DefaultProfileName)
		if val == nil {
			t.Errorf("default.yaml lacks %s", problem.Key(path, DefaultProfileName))
			return
		}
		checkComplete(t, typ.Elem(), val, k, problem.Key(path, DefaultProfileName), leaves)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			t.Errorf("default.yaml: %s is not a list", path)
			return
		}
		elem := typ.Elem()
		if elem.Kind() != reflect.Struct {
			*leaves++
			return
		}
		if len(n.Content) == 0 {
			comments := key.HeadComment + key.LineComment + n.LineComment
			names, _ := fields(elem)
			for _, name := range names {
				*leaves++
				if !strings.Contains(comments, name+":") {
					t.Errorf("default.yaml: the comment on empty list %s does not show key %q", path, name)
				}
			}
			return
		}
		for i, item := range n.Content {
			checkComplete(t, elem, item, nil, path+"["+string(rune('0'+i))+"]", leaves)
		}
	default:
		*leaves++
		if n.Kind != yaml.ScalarNode {
			t.Errorf("default.yaml: %s is not a scalar", path)
		}
	}
}

func TestDefaultYAMLIsComplete(t *testing.T) {
	leaves := 0
	checkComplete(t, reflect.TypeOf(Config{}), parseDefaultYAML(t), nil, "", &leaves)
	if leaves < 80 {
		t.Errorf("walked only %d leaves; the schema walk is broken", leaves)
	}
}

// TestDefaultYAMLIsCommented requires a comment on every key of default.yaml, except the
// keys of the engines after the first (which repeat the first one's).
func TestDefaultYAMLIsCommented(t *testing.T) {
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := problem.Key(path, k.Value)
				if k.HeadComment == "" && k.LineComment == "" && v.LineComment == "" {
					t.Errorf("default.yaml: key %s has no comment", p)
				}
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, item := range n.Content {
				if path == "engines" && i > 0 {
					continue
				}
				walk(item, path+"[i]")
			}
		}
	}
	walk(parseDefaultYAML(t), "")
}

// badCase is one kind of bad config and the problem line it must produce.
type badCase struct {
	name string
	src  string
	// line is the expected problem line when exact; otherwise path (may be empty for
	// document-level problems) and phrase are checked.
	line   string
	path   string
	phrase string
	// count is the expected number of problems (1 when zero): no cascades.
	count int
}

func badCases() []badCase {
	pinnedPrefill := `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill, pinned: true}
  - {id: e2, address: "127.0.0.1:8002", role: prefill, pinned: true}
  - {id: e3, address: "127.0.0.1:8003", role: prefill, pinned: true}
  - {id: e4, address: "127.0.0.1:8004", role: prefill, pinned: true}
`
	prefillOnly := `
profiles:
  pre-only:
    prefill: {base_s: 0.01, per_token_s: 1.0e-5}
`
	return []badCase{
		{name: "unknown key", src: "router:\n  pathz: [\"/x\"]\n" + twoEngines,
			line: `router.pathz: unknown key (did you mean "paths"?)`},
		{name: "unknown top-level key", src: "enginez: []\n" + twoEngines,
			line: `enginez: unknown key (did you mean "engines"?)`},
		{name: "unknown key without a close name", src: "slo: {latency: 1}\n" + twoEngines,
			line: `slo.latency: unknown key; known keys: ttft_s, tpot_s`},
		{name: "duplicate key", src: "slo:\n  ttft_s: 1\n  ttft_s: 2\n" + twoEngines,
			line: `slo.ttft_s: duplicate key (first at line 2)`},
		{name: "string for number", src: "slo: {tpot_s: fast}\n" + twoEngines,
			line: `slo.tpot_s: expected a number, found string "fast"`},
		{name: "quoted number", src: "slo: {ttft_s: \"0.5\"}\n" + twoEngines,
			line: `slo.ttft_s: expected a number, found string "0.5"`},
		{name: "number for bool", src: "controller: {advisory: 1}\n" + twoEngines,
			line: `controller.advisory: expected a boolean (true or false), found integer 1`},
		{name: "scalar for mapping", src: "router: {waiting_set: 5}\n" + twoEngines,
			line: `router.waiting_set: expected a mapping, found integer 5`},
		{name: "scalar for list", src: "router: {paths: /v1/completions}\n" + twoEngines,
			line: `router.paths: expected a list, found string "/v1/completions"`},
		{name: "list for scalar", src: "health: {path: [/a]}\n" + twoEngines,
			line: `health.path: expected a string, found a list`},
		{name: "float for int", src: "router: {waiting_set: {capacity: 1.5}}\n" + twoEngines,
			line: `router.waiting_set.capacity: expected an integer, found float 1.5`},
		{name: "number for string", src: "engines:\n  - {id: 7, address: \"127.0.0.1:8001\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].id: expected a string, found integer 7 (quote it to make it a string)`},
		{name: "non-finite number", src: "slo: {ttft_s: .inf}\n" + twoEngines,
			line: `slo.ttft_s: must be a finite number, got .inf`},
		{name: "integer overflow", src: "router: {body_limit_bytes: 99999999999999999999999}\n" + twoEngines,
			line: `router.body_limit_bytes: expected an integer, found float 99999999999999999999999`},
		{name: "out of range", src: "controller: {thresholds: {dwell_s: -5}}\n" + twoEngines,
			line: `controller.thresholds.dwell_s: must be >= 0, got -5`},
		{name: "body limit too small", src: "router: {body_limit_bytes: 100}\n" + twoEngines,
			line: `router.body_limit_bytes: must be >= 1024, got 100`},
		{name: "zero slo", src: "slo: {ttft_s: 0}\n" + twoEngines,
			line: `slo.ttft_s: must be > 0, got 0`},
		{name: "noise too large", src: "sim: {noise_sigma: 3}\n" + twoEngines,
			line: `sim.noise_sigma: must be <= 2, got 3`},
		{name: "short horizon above long", src: "router: {demand: {short_horizon_s: 200}}\n" + twoEngines,
			line: `router.demand.short_horizon_s: must be <= long_horizon_s (120), got 200`},
		{name: "path without slash", src: "router: {paths: [v1/completions]}\n" + twoEngines,
			line: `router.paths[0]: must start with "/", got "v1/completions"`},
		{name: "duplicate path", src: "router: {paths: [/a, /b, /a]}\n" + twoEngines,
			line: `router.paths[2]: duplicate of router.paths[0] ("/a")`},
		{name: "empty paths", src: "router: {paths: []}\n" + twoEngines,
			line: `router.paths: must list at least one path`},
		{name: "missing profile reference", src: "engines:\n  - {id: e1, address: \"127.0.0.1:8001\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode, profile: h100}\n",
			line: `engines[1].profile: unknown profile "h100"; known: llama-3.1-8b-fp8-h200`},
		{name: "duplicate engine id", src: "engines:\n  - {id: e1, address: \"127.0.0.1:8001\", role: prefill}\n  - {id: e1, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[1].id: duplicate id "e1" (also engines[0])`},
		{name: "invalid engine id", src: "engines:\n  - {id: \"e 1\", address: \"127.0.0.1:8001\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].id: must use only A-Z a-z 0-9 . _ -, got "e 1"`},
		{name: "duplicate engine address", src: "engines:\n  - {id: e1, address: \"127.0.0.1:8001\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:08001\", role: decode}\n",
			line: `engines[1].address: "127.0.0.1:08001" is the same address as engines[0] (e1, "127.0.0.1:8001")`},
		{name: "duplicate engine host name", src: "engines:\n  - {id: e1, address: \"Engine-A:8000\", role: prefill}\n  - {id: e2, address: \"engine-a:8000\", role: decode}\n",
			path: "engines[1].address", phrase: "is the same address as engines[0]"},
		{name: "bad port", src: "engines:\n  - {id: e1, address: \"127.0.0.1:70000\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].address: port must be 1-65535, got "70000" in "127.0.0.1:70000"`},
		{name: "address without port", src: "engines:\n  - {id: e1, address: \"10.0.0.1\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].address: must be host:port, got "10.0.0.1"`},
		{name: "engine without host", src: "engines:\n  - {id: e1, address: \":8001\", role: prefill}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].address: host must not be empty, got ":8001"`},
		{name: "bad listen address", src: "listen: {admin: \"localhost\"}\n" + twoEngines,
			line: `listen.admin: must be host:port, got "localhost"`},
		{name: "listen address clash", src: "listen: {xds: \"127.0.0.1:9002\"}\n" + twoEngines,
			line: `listen.xds: "127.0.0.1:9002" conflicts with listen.extproc ("127.0.0.1:9002")`},
		{name: "listen wildcard clash", src: "listen: {admin: \":9002\"}\n" + twoEngines,
			line: `listen.admin: ":9002" conflicts with listen.extproc ("127.0.0.1:9002")`},
		{name: "floors larger than the fleet", src: "controller: {min_prefill: 3, min_decode: 2}\n" + `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill}
  - {id: e2, address: "127.0.0.1:8002", role: prefill}
  - {id: e3, address: "127.0.0.1:8003", role: decode}
  - {id: e4, address: "127.0.0.1:8004", role: decode}
`,
			line: `controller.min_decode: floors need 5 engines (min_prefill 3 + min_decode 2), fleet has 4`},
		{name: "pinned engines make a floor impossible", src: pinnedPrefill,
			line: `controller.min_decode: floor 1 cannot be met: pinned engines keep their roles, leaving engines able to hold decode: 0 (pinned to prefill: 4)`},
		{name: "some pinned engines make a floor impossible", src: "controller: {min_prefill: 1, min_decode: 2}\n" + `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill, pinned: true}
  - {id: e2, address: "127.0.0.1:8002", role: prefill, pinned: true}
  - {id: e3, address: "127.0.0.1:8003", role: prefill, pinned: true}
  - {id: e4, address: "127.0.0.1:8004", role: decode}
  - {id: e5, address: "127.0.0.1:8005", role: prefill, profile: pre-only}
` + prefillOnly,
			line: `controller.min_decode: floor 2 cannot be met: pinned engines keep their roles, leaving engines able to hold decode: 1 (pinned to prefill: 3)`},
		{name: "no engine can hold a floor's role", src: prefillOnly + `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill, profile: pre-only}
  - {id: e2, address: "127.0.0.1:8002", role: prefill, profile: pre-only}
`,
			line: `controller.min_decode: floor 1 cannot be met: engines that can play decode (a profile with its curve, engines[].roles): 0`},
		{name: "profile lacks the role's curve", src: prefillOnly + `
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill, profile: pre-only}
  - {id: e2, address: "127.0.0.1:8002", role: decode, profile: pre-only}
`,
			line: `engines[1].profile: profile "pre-only" has no decode curve, so it cannot hold role decode`},
		{name: "null curve removes it", src: "profiles:\n  llama-3.1-8b-fp8-h200: {decode: null}\n" + twoEngines,
			line: `engines[1].profile: profile "llama-3.1-8b-fp8-h200" has no decode curve, so it cannot hold role decode`},
		{name: "non-increasing curve", src: "profiles:\n  flat:\n    prefill: {base_s: 0.02}\n" + twoEngines,
			line: `profiles.flat.prefill: curve is non-increasing: 0.02 s at 1 token, 0.02 s at 16384 tokens (per_token_s or per_token2_s must be > 0)`},
		{name: "negative coefficient", src: "profiles:\n  big:\n    decode: {base_s: 0.01, per_stream_s: -1}\n" + twoEngines,
			line: `profiles.big.decode.per_stream_s: must be >= 0, got -1`},
		{name: "zero decode base", src: "profiles:\n  big:\n    decode: {base_s: 0}\n" + twoEngines,
			line: `profiles.big.decode.base_s: must be > 0, got 0`},
		{name: "chunk budget zero", src: "profiles:\n  big:\n    decode: {base_s: 0.01}\n    prefill: {base_s: 0.02, per_token_s: 0.0001}\n    chunked_prefill: {budget_tokens: -1}\n" + twoEngines,
			line: `profiles.big.chunked_prefill.budget_tokens: must be >= 0, got -1`},
		{name: "profile without curves", src: "profiles:\n  empty: {kv_transfer_s: 0}\n" + twoEngines,
			line: `profiles.empty: must have a prefill curve, a decode curve or both`},
		{name: "bad profile name", src: "profiles:\n  \"big one\": {decode: {base_s: 0.01}}\n" + twoEngines,
			line: `profiles["big one"]: a profile name must use only A-Z a-z 0-9 . _ -, got "big one"`},
		{name: "bad role", src: "engines:\n  - {id: e1, address: \"127.0.0.1:8001\", role: prefil}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			line: `engines[0].role: must be prefill or decode, got "prefil"`},
		{name: "bad handoff", src: "router: {handoff: push}\n" + twoEngines,
			line: `router.handoff: must be decode or prefill, got "push"`},
		{name: "bad sizing method", src: "router: {sizing: {method: words}}\n" + twoEngines,
			line: `router.sizing.method: must be bytes or bpe, got "words"`},
		{name: "bad bpe encoding", src: "router: {sizing: {method: bpe, encoding: gpt2}}\n" + twoEngines,
			line: `router.sizing.encoding: must be one of cl100k_base, o200k_base, p50k_base, r50k_base, got "gpt2"`},
		{name: "negative non-text cost", src: "router: {sizing: {non_text_tokens: -1}}\n" + twoEngines,
			line: `router.sizing.non_text_tokens: must be >= 0, got -1`},
		{name: "bad fault kind", src: "sim: {faults: [{at_s: 1, engine: e1, kind: explode}]}\n" + twoEngines,
			line: `sim.faults[0].kind: must be one of fail, recover, drain, undrain, got "explode"`},
		{name: "fault names an unknown engine", src: "sim: {faults: [{at_s: 1, engine: e9, kind: fail}]}\n" + twoEngines,
			line: `sim.faults[0].engine: unknown engine "e9"; known: e1, e2`},
		{name: "shrink >= expand", src: "controller: {thresholds: {shrink: 0.95}}\n" + twoEngines,
			line: `controller.thresholds.shrink: must be < expand (0.9), got 0.95`},
		{name: "open window expand below expand", src: "controller: {thresholds: {open_window: {expand: 0.8}}}\n" + twoEngines,
			line: `controller.thresholds.open_window.expand: must be >= thresholds.expand (0.9), got 0.8`},
		{name: "urgent delay >= step", src: "controller: {reactive: {urgent_delay_s: 5}}\n" + twoEngines,
			line: `controller.reactive.urgent_delay_s: must be < step_s (5), got 5`},
		{name: "evidence max span below span", src: "controller: {reactive: {evidence_max_span_s: 1}}\n" + twoEngines,
			line: `controller.reactive.evidence_max_span_s: must be >= evidence_span_s (2), got 1`},
		{name: "health timeout above interval", src: "health: {timeout_s: 2}\n" + twoEngines,
			line: `health.timeout_s: must be <= interval_s (1), got 2`},
		{name: "bad cluster prefix", src: "xds: {cluster_prefix: Narwhal_1}\n" + twoEngines,
			line: `xds.cluster_prefix: must use only a-z 0-9 - and not start with '-', got "Narwhal_1"`},
		{name: "no engines", src: "",
			line: `engines: at least one engine is required`},
		{name: "YAML syntax error", src: "router:\n  paths: [/a\n",
			path: "", phrase: "syntax error: line "},
		{name: "tab indentation", src: "router:\n\tpaths: []\n",
			path: "", phrase: "syntax error: line 2"},
		{name: "two documents", src: "slo: {ttft_s: 1}\n---\nslo: {ttft_s: 2}\n",
			line: `syntax error: line 2: a second YAML document; a config is one document`},
		{name: "not a mapping", src: "- a\n- b\n",
			line: `line 1: the config must be a mapping of keys, found a list`},
		{name: "bad merge", src: "slo:\n  <<: 5\n" + twoEngines,
			path: `slo["<<"]`, phrase: "a merge key needs a mapping"},
	}
}

func TestLoadRejects(t *testing.T) {
	seen := make(map[string]bool)
	for _, tc := range badCases() {
		t.Run(tc.name, func(t *testing.T) {
			if seen[tc.src] {
				t.Fatalf("two cases share the same config")
			}
			seen[tc.src] = true
			cfg, err := Load([]byte(tc.src))
			if err == nil {
				t.Fatalf("Load accepted the config:\n%s", tc.src)
			}
			if cfg != nil {
				t.Errorf("Load returned a config with its error")
			}
			errs := problemsOf(t, err)
			want := max(tc.count, 1)
			if len(errs) != want {
				t.Errorf("got %d problems, want %d:\n%v", len(errs), want, err)
			}
			if !hasLine(errs, tc) {
				t.Errorf("no problem line matches\n  want %s\n  got:\n%v", describeCase(tc), err)
			}
		})
	}
	if len(seen) < 20 {
		t.Errorf("only %d distinct bad configs", len(seen))
	}
}

func hasLine(errs problem.List, tc badCase) bool {
	for _, p := range errs {
		line := p.String()
		switch {
		case tc.line != "":
			if line == tc.line {
				return true
			}
		case tc.path == "":
			if p.Path == "" && strings.HasPrefix(line, tc.phrase) {
				return true
			}
		default:
			if strings.HasPrefix(line, tc.path+": ") && strings.Contains(line, tc.phrase) {
				return true
			}
		}
	}
	return false
}

func describeCase(tc badCase) string {
	if tc.line != "" {
		return tc.line
	}
	return tc.path + ": ..." + tc.phrase + "..."
}

func TestManyProblemsAllReportedInOrder(t *testing.T) {
	src := `
listen:
  admin: "127.0.0.1:99999"
router:
  pathz: []
  waiting_set: {capacity: many}
controller:
  thresholds: {dwell_s: -5}
profiles:
  zeta: {decode: {base_s: -1}}
  alpha: {decode: {base_s: 0}}
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill}
  - {id: e1, address: "127.0.0.1:8002", role: decode, profile: h100}
`
	want := strings.Join([]string{
		`router.pathz: unknown key (did you mean "paths"?)`,
		`router.waiting_set.capacity: expected an integer, found string "many"`,
		`listen.admin: port must be 0-65535, got "99999" in "127.0.0.1:99999"`,
		`controller.thresholds.dwell_s: must be >= 0, got -5`,
		`profiles.alpha.decode.base_s: must be > 0, got 0`,
		`profiles.zeta.decode.base_s: must be > 0, got -1`,
		`engines[1].id: duplicate id "e1" (also engines[0])`,
		`engines[1].profile: unknown profile "h100"; known: alpha, llama-3.1-8b-fp8-h200, zeta`,
	}, "\n")
	for i := 0; i < 20; i++ { // map order must not leak into the output
		_, err := Load([]byte(src))
		if err == nil {
			t.Fatal("Load accepted a config with many problems")
		}
		if got := err.Error(); got != want {
			t.Fatalf("run %d: got\n%s\nwant\n%s", i, got, want)
		}
	}
}

// TestNoCascades checks that a value that could not be decoded is reported once, not again
// by the validation rules that read it.
func TestNoCascades(t *testing.T) {
	cases := []struct{ src, want string }{
		{"engines: 5\n", `engines: expected a list, found integer 5`},
		{"profiles:\n  big: 5\nengines:\n  - {id: e1, address: \"127.0.0.1:8001\", role: prefill, profile: big}\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n",
			`profiles.big: expected a mapping, found integer 5`},
		{"controller: {reactive: {step_s: x}}\n" + twoEngines, `controller.reactive.step_s: expected a number, found string "x"`},
		{"engines:\n  - 5\n  - {id: e2, address: \"127.0.0.1:8002\", role: decode}\n", `engines[0]: expected a mapping, found integer 5`},
	}
	for _, tc := range cases {
		_, err := Load([]byte(tc.src))
		if err == nil {
			t.Errorf("Load accepted\n%s", tc.src)
			continue
		}
		if got := err.Error(); got != tc.want {
			t.Errorf("Load(%q):\n got %s\nwant %s", tc.src, got, tc.want)
		}
	}
}

func TestPartialProfileOverride(t *testing.T) {
	cfg := mustLoad(t, "profiles:\n  llama-3.1-8b-fp8-h200:\n    prefill: {base_s: 0.02}\n    kv_transfer_s: 0.01\n"+twoEngines)
	got := cfg.Profiles[DefaultProfileName]
	want := DefaultProfile()
	want.Prefill.BaseS = 0.02
	want.KVTransferS = 0.01
	if !reflect.DeepEqual(got, want) {
		t.Errorf("partial override: got %+v %+v %+v, want %+v %+v %+v",
			got, *got.Prefill, *got.Decode, want, *want.Prefill, *want.Decode)
	}
	if len(cfg.Profiles) != 1 {
		t.Errorf("profiles = %v, want only the default", cfg.ProfileNames())
	}
}

func TestNewProfileGetsDefaults(t *testing.T) {
	cfg := mustLoad(t, `
profiles:
  big:
    prefill: {base_s: 0.03, per_token_s: 2.0e-5}
  small:
    decode: {base_s: 0.01}
    prefill_concurrency: 2
engines:
  - {id: e1, address: "127.0.0.1:8001", role: prefill, profile: big}
  - {id: e2, address: "127.0.0.1:8002", role: decode, profile: small}
`)
	wantBig := Profile{
		Prefill:            &PrefillCurve{BaseS: 0.03, PerTokenS: 2.0e-5, MaxTokens: 16384},
		PrefillConcurrency: 4,
		KVTransferS:        0.005,
		ChunkedPrefill:     ChunkedPrefill{BudgetTokens: 8192},
	}
	wantSmall := Profile{
		PrefillConcurrency: 2,
		Decode:             &DecodeCurve{BaseS: 0.01, MaxStreams: 256, MaxKVTokens: 945000},
		KVTransferS:        0.005,
		ChunkedPrefill:     ChunkedPrefill{BudgetTokens: 8192},
	}
	if got := cfg.Profiles["big"]; !reflect.DeepEqual(got, wantBig) {
		t.Errorf("big = %+v %+v, want %+v %+v", got, got.Prefill, wantBig, wantBig.Prefill)
	}
	if got := cfg.Profiles["small"]; !reflect.DeepEqual(got, wantSmall) {
		t.Errorf("small = %+v %+v, want %+v %+v", got, got.Decode, wantSmall, wantSmall.Decode)
	}
	if got, want := cfg.ProfileNames(), []string{"big", DefaultProfileName, "small"}; !reflect.DeepEqual(got, want) {
		t.Errorf("ProfileNames() = %v, want %v", got, want)
	}
}

func TestDecodeSemantics(t *testing.T) {
	cfg := mustLoad(t, `
router:
  paths: [/only]
  prefix_affinity: {enabled: false}
controller:
  min_decode: null          # null keeps the default
engines:
  - &eng {id: e1, address: "10.0.0.1:8000", role: prefill, pinned: true}
  - <<: *eng
    id: e2
    address: "10.0.0.2:8000"
    role: decode
`)
	if got := cfg.Router.Paths; !reflect.DeepEqual(got, []string{"/only"}) {
		t.Errorf("paths = %v: a list must replace the default", got)
	}
	if cfg.Router.PrefixAffinity.Enabled || cfg.Router.PrefixAffinity.BlockTokens != 64 {
		t.Errorf("prefix_affinity = %+v, want only enabled changed", cfg.Router.PrefixAffinity)
	}
	if cfg.Controller.MinDecode != 1 {
		t.Errorf("min_decode = %d, want the default 1 for null", cfg.Controller.MinDecode)
	}
	want := []Engine{
		{ID: "e1", Address: "10.0.0.1:8000", Role: RolePrefill, Profile: DefaultProfileName, Pinned: true, Switch: SwitchRouting},
		{ID: "e2", Address: "10.0.0.2:8000", Role: RoleDecode, Profile: DefaultProfileName, Pinned: true, Switch: SwitchRouting},
	}
	if !reflect.DeepEqual(cfg.Engines, want) {
		t.Errorf("engines = %+v, want %+v (setDefaults profile, merge key)", cfg.Engines, want)
	}
}

func TestEmptyDocumentKeepsDefaults(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "---\n", "~\n", "{}\n"} {
		cfg, res := decode([]byte(src))
		if len(res.problems) != 0 || res.fatal {
			t.Errorf("decode(%q): problems %v", src, res.problems)
		}
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("decode(%q) = %+v, want Default()", src, cfg)
		}
	}
}

// TestHostileDocumentsAreBounded checks that aliases reused over and over cannot make
// decoding run away, in time or in problem lines.
func TestHostileDocumentsAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("profiles:\n  p: &P\n")
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&b, "    k%d: 1\n", i)
	}
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&b, "  a%d: *P\n", i)
	}
	_, err := Load([]byte(b.String()))
	errs := problemsOf(t, err)
	if len(errs) > maxProblems+1 {
		t.Errorf("%d problems, want at most %d", len(errs), maxProblems+1)
	}
	if last := errs[len(errs)-1].String(); !strings.HasPrefix(last, "too many problems") {
		t.Errorf("last problem = %q, want the too-many-problems line", last)
	}

	b.Reset()
	b.WriteString("sim:\n  faults: &f\n")
	for i := 0; i < 500; i++ {
		b.WriteString("    - {at_s: 1, engine: e1, kind: fail}\n")
	}
	b.WriteString("profiles:\n")
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&b, "  p%d: {prefill_concurrency: *f}\n", i)
	}
	_, err = Load([]byte(b.String()))
	errs = problemsOf(t, err)
	if len(errs) > maxProblems+1 {
		t.Errorf("%d problems, want at most %d", len(errs), maxProblems+1)
	}
}

func TestValidate(t *testing.T) {
	cfg := Default()
	cfg.Engines = fourEngines()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Default() with four engines: %v", err)
	}
	cfg.Controller.Thresholds.DwellS = -1
	cfg.Engines[3].Role = "both"
	errs := problemsOf(t, cfg.Validate())
	want := problem.List{
		{Path: "controller.thresholds.dwell_s", Msg: "must be >= 0, got -1"},
		{Path: "engines[3].role", Msg: `must be prefill or decode, got "both"`},
	}
	if !reflect.DeepEqual(errs, want) {
		t.Errorf("Validate() = %v, want %v", errs, want)
	}
	var nilCfg *Config
	if nilCfg.Validate() == nil {
		t.Errorf("Validate on a nil config returned nil")
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, Embedded(), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(good); err != nil {
		t.Errorf("LoadFile(good): %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("slo: {ttft_s: -1}\n"+twoEngines), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFile(bad); err == nil || !strings.HasPrefix(err.Error(), "slo.ttft_s: ") {
		t.Errorf("LoadFile(bad) = %v, want a slo.ttft_s problem", err)
	}
	missing := filepath.Join(dir, "missing.yaml")
	_, err := LoadFile(missing)
	var errs problem.List
	if err == nil || errors.As(err, &errs) || !strings.Contains(err.Error(), missing) {
		t.Errorf("LoadFile(missing) = %v, want a plain error naming the file", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadFile(missing) does not wrap os.ErrNotExist: %v", err)
	}
}

func TestErrorsFormat(t *testing.T) {
	errs := problem.List{{Path: "a.b", Msg: "bad"}, {Msg: "syntax error: line 1: x"}}
	if got, want := errs.Error(), "a.b: bad\nsyntax error: line 1: x"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func FuzzLoad(f *testing.F) {
	f.Add(Embedded())
	for _, tc := range badCases() {
		f.Add([]byte(tc.src))
	}
	for _, s := range []string{
		"a: &a [*a]\n",
		"slo: &s {<<: *s}\n",
		"engines: &e [*e, *e]\n",
		"profiles: {a: &p {prefill: &c {base_s: 1}}, b: *p, c: {<<: [*p, *p]}}\n",
		"router: {paths: !!binary aGVsbG8=}\n",
		"? [a]\n: b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Load(data)
		if err == nil {
			if cfg == nil {
				t.Fatal("nil config without an error")
			}
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Load accepted a config Validate rejects: %v", verr)
			}
			return
		}
		if cfg != nil {
			t.Fatal("config returned with an error")
		}
		var errs problem.List
		if !errors.As(err, &errs) || len(errs) == 0 {
			t.Fatalf("error is not a non-empty problem.List: %v", err)
		}
		for _, p := range errs {
			if p.Msg == "" || strings.Contains(p.String(), "\n") {
				t.Fatalf("bad problem line %q", p.String())
			}
		}
		if _, err2 := Load(data); err2 == nil || err2.Error() != err.Error() {
			t.Fatalf("Load is not deterministic:\n%v\n----\n%v", err, err2)
		}
	})
}

// A listener may take port 0 (the system picks a free one): three of them on one host do not
// conflict; an engine's address still needs a real port.
func TestListenAnyPort(t *testing.T) {
	cfg, err := Load([]byte("listen: {admin: \"127.0.0.1:0\", extproc: \"127.0.0.1:0\", xds: \"127.0.0.1:0\"}\n" + twoEngines))
	if err != nil || cfg.Listen.Admin != "127.0.0.1:0" {
		t.Fatalf("port 0 listeners: %v", err)
	}
	_, err = Load([]byte("engines:\n  - {id: a, address: \"127.0.0.1:0\", role: prefill}\n  - {id: b, address: \"127.0.0.1:2\", role: decode}\n"))
	if err == nil || !strings.Contains(err.Error(), `engines[0].address: port must be 1-65535, got "0"`) {
		t.Fatalf("an engine on port 0: %v", err)
	}
}

// ha.* is checked only when replicas are configured; each bad value is named.
func TestHAConfig(t *testing.T) {
	cfg, err := Load([]byte("ha: {etcd: {endpoints: [\"http://etcd:2379\"]}}\n" + twoEngines))
	if err != nil || !cfg.HA.Enabled() || cfg.HA.Etcd.Prefix != "/narwhal" || cfg.HA.LeaseTTLS != 5 {
		t.Fatalf("%+v %v", cfg.HA, err)
	}
	_, err = Load([]byte("ha: {etcd: {endpoints: [\"etcd:2379\"], prefix: narwhal, tls: {cert_file: c.pem}}, lease_ttl_s: 0}\n" + twoEngines))
	for _, want := range []string{`ha.etcd.endpoints[0]: must be an http:// or https:// URL`, `ha.etcd.prefix: must start with /`,
		`ha.lease_ttl_s: must be >= 1`, `ha.etcd.tls: cert_file and key_file go together`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	// TLS files with a plaintext endpoint: the etcd client would dial it unencrypted.
	_, err = Load([]byte("ha: {etcd: {endpoints: [\"https://etcd-0:2379\", \"http://etcd-1:2379\"], tls: {ca_file: ca.pem}}}\n" + twoEngines))
	if err == nil || !strings.Contains(err.Error(), `ha.etcd.endpoints[1]: "http://etcd-1:2379" is plaintext but ha.etcd.tls is set`) || strings.Contains(err.Error(), "endpoints[0]") {
		t.Errorf("an http:// endpoint beside ha.etcd.tls: %v", err)
	}
	if _, err := Load([]byte("ha: {etcd: {endpoints: [\"https://etcd-0:2379\"], tls: {ca_file: ca.pem}}}\n" + twoEngines)); err != nil {
		t.Errorf("https with TLS: %v", err)
	}
}

// A fleet that comes from discovery may start with no engines; a member that joins at run time
// is checked as a configured engine is, with a clear error.
func TestDiscoveryAndMembers(t *testing.T) {
	cfg := mustLoad(t, "discovery: {file: {path: /etc/narwhal/endpoints.yaml}}\n")
	if len(cfg.Engines) != 0 || !cfg.Discovery.Dynamic() || cfg.Discovery.RoleLabel != LabelRole {
		t.Fatalf("discovery = %+v, %d engines", cfg.Discovery, len(cfg.Engines))
	}
	if _, err := Load([]byte("discovery: {file: {path: x, resync_s: 0}, switch: teleport, default_profile: nope}\n")); err == nil ||
		!strings.Contains(err.Error(), "discovery.switch") || !strings.Contains(err.Error(), "discovery.file.resync_s") || !strings.Contains(err.Error(), `unknown profile "nope"`) {
		t.Fatalf("bad discovery: %v", err)
	}
	if got := cfg.DiscoveredProfile(""); got != DefaultProfileName {
		t.Errorf("profile without a label = %q, want the only profile", got)
	}
	for _, tc := range []struct {
		e    Engine
		want string // "" = accepted
	}{
		{Engine{ID: "k1", Address: "10.0.0.1:8000", Role: "prefill", Profile: DefaultProfileName}, ""},
		{Engine{ID: "k1", Address: "10.0.0.1:8000", Profile: DefaultProfileName}, ""},
		{Engine{ID: "k 1", Address: "10.0.0.1:8000", Profile: DefaultProfileName}, "engine.id: must use only"},
		{Engine{ID: "k1", Address: "10.0.0.1", Profile: DefaultProfileName}, "engine.address"},
		{Engine{ID: "k1", Address: "10.0.0.1:8000", Profile: "big"}, `engine.profile: unknown profile "big"`},
		{Engine{ID: "k1", Address: "10.0.0.1:8000", Role: "aggregate", Profile: DefaultProfileName}, "engine.role"},
		{Engine{ID: "k1", Address: "10.0.0.1:8000", Profile: DefaultProfileName, Switch: "x"}, "engine.switch"},
	} {
		err := cfg.CheckMember(tc.e)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckMember(%+v): %v", tc.e, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckMember(%+v) = %v, want %q", tc.e, err, tc.want)
		}
	}
}

// tls.*: each listener's cert_file and key_file go together, a client CA needs the listener's
// own certificate, certificate identities need client certificates; TLS alone (no client CA)
// does not open the admin API to other machines.
func TestTLSConfig(t *testing.T) {
	for src, want := range map[string]string{
		"tls: {extproc: {cert_file: a.crt}}\n" + twoEngines:                                           "tls.extproc: cert_file and key_file go together",
		"tls: {xds: {key_file: a.key}}\n" + twoEngines:                                                "tls.xds: cert_file and key_file go together",
		"tls: {admin: {client_ca_file: ca.crt}}\n" + twoEngines:                                       "tls.admin.client_ca_file: mutual TLS needs the listener's own certificate",
		"xds: {identities: [spiffe://x/envoy]}\n" + twoEngines:                                        "xds.identities: certificate identities need client certificates",
		"tls: {xds: {cert_file: a, key_file: b}}\nxds: {identities: [x]}\n" + twoEngines:              "xds.identities: certificate identities need client certificates",
		"xds: {nodes: [\"\"]}\n" + twoEngines:                                                         "xds.nodes[0]: must not be empty",
		"listen: {admin: \"0.0.0.0:9090\"}\ntls: {admin: {cert_file: a, key_file: b}}\n" + twoEngines: "listen.admin: 0.0.0.0:9090 is reachable from other machines",
		// A client CA alone is not enough: Envoy's certificate may come from the same CA.
		"listen: {admin: \"0.0.0.0:9090\"}\ntls: {admin: {cert_file: a, key_file: b, client_ca_file: c}}\n" + twoEngines: "require client certificates naming its operators (tls.admin.client_ca_file and admin.identities)",
		"admin: {identities: [ops]}\n" + twoEngines:                              "admin.identities: certificate identities need client certificates",
		"tls: {extproc: {cert_file: a, key_file: b, ca_file: c}}\n" + twoEngines: "tls.extproc.ca_file",
	} {
		if _, err := Load([]byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	cfg, err := Load([]byte("tls: {extproc: {cert_file: a, key_file: b, client_ca_file: c}, xds: {cert_file: a, key_file: b, client_ca_file: c}}\n" +
		"xds: {nodes: [envoy-1], identities: [spiffe://x/envoy]}\n" + twoEngines))
	if err != nil || !cfg.TLS.ExtProc.Mutual() || !cfg.TLS.XDS.Enabled() || cfg.TLS.Admin.Enabled() || len(cfg.XDS.Nodes) != 1 {
		t.Fatalf("%+v %v", cfg.TLS, err)
	}
}

// An admin API reachable from other machines needs a token; the token may come from a file or an
// environment variable, and is at least 32 bytes and not the examples' placeholder wherever it
// comes from (a weak one is refused with the way to make one, never repeating it).
func TestAdminAccess(t *testing.T) {
	const good = "0123456789abcdef0123456789abcdef" // 32 bytes
	for src, want := range map[string]string{
		"admin: {token: x}\n" + twoEngines:                                       "admin.token: the token is 1 bytes, fewer than 32: make one with `openssl rand -hex 32`",
		"admin: {token: change-me}\n" + twoEngines:                               "admin.token: the token is a placeholder",
		"admin: {token: change-me-change-me-change-me-change-me}\n" + twoEngines: "admin.token: the token is a placeholder",
		"admin: {hosts: [\"narwhal:9090\"]}\n" + twoEngines:                      "admin.hosts[0]: \"narwhal:9090\" is not a host name",
		"listen: {admin: \"0.0.0.0:9090\"}\n" + twoEngines:                       "listen.admin: 0.0.0.0:9090 is reachable from other machines and the admin API has no token",
		"listen: {admin: \"10.1.2.3:9090\"}\n" + twoEngines:                      "is reachable from other machines",
		"admin: {token: a, token_env: B}\n" + twoEngines:                         "admin.token: set one of token, token_file and token_env",
	} {
		if _, err := Load([]byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	for _, src := range []string{
		"listen: {admin: \"127.0.0.1:9090\"}\n" + twoEngines,
		"listen: {admin: \"localhost:9090\"}\n" + twoEngines,
		"listen: {admin: \"[::1]:9090\"}\n" + twoEngines,
		"listen: {admin: \"0.0.0.0:9090\"}\nadmin: {token_env: NARWHAL_TEST_TOKEN}\n" + twoEngines,
		"admin: {token: " + good + ", hosts: [narwhal.llm.svc]}\n" + twoEngines,
		// Mutual TLS with named identities stands for the token.
		"listen: {admin: \"0.0.0.0:9090\"}\ntls: {admin: {cert_file: a.crt, key_file: a.key, client_ca_file: ca.crt}}\nadmin: {identities: [ops]}\n" + twoEngines,
	} {
		if _, err := Load([]byte(src)); err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("  "+good+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	weak := filepath.Join(t.TempDir(), "weak")
	if err := os.WriteFile(weak, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NARWHAL_TEST_TOKEN", good+"-env")
	t.Setenv("NARWHAL_TEST_WEAK", "change-me")
	for _, tc := range []struct {
		a    Admin
		want string
		err  string
	}{
		{Admin{Token: good}, good, ""},
		{Admin{Token: "t"}, "", "admin.token: the token is 1 bytes, fewer than 32"},
		{Admin{TokenFile: file}, good, ""},
		{Admin{TokenFile: weak}, "", "admin.token_file " + weak + ": the token is 6 bytes, fewer than 32"},
		{Admin{TokenEnv: "NARWHAL_TEST_TOKEN"}, good + "-env", ""},
		{Admin{TokenEnv: "NARWHAL_TEST_WEAK"}, "", "admin.token_env NARWHAL_TEST_WEAK: the token is a placeholder"},
		{Admin{TokenEnv: "NARWHAL_TEST_UNSET"}, "", "NARWHAL_TEST_UNSET is not set"},
		{Admin{TokenFile: file + ".missing"}, "", "admin.token_file"},
		{Admin{}, "", ""},
	} {
		got, err := tc.a.ResolveToken()
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%+v: %q %v, want %q %q", tc.a, got, err, tc.want, tc.err)
		}
		if err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "change-me")) {
			t.Errorf("%+v: the error repeats the token: %v", tc.a, err)
		}
	}
}

// state.dir "" is narwhal under the user's state home: $XDG_STATE_HOME when it is absolute,
// else ~/.local/state.
func TestDefaultStateDir(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/var/lib/x")
	if got := (State{}).StateDir(); got != "/var/lib/x/narwhal" {
		t.Errorf("with XDG_STATE_HOME: %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "relative")
	t.Setenv("HOME", "/home/op")
	if got := (State{}).StateDir(); got != "/home/op/.local/state/narwhal" {
		t.Errorf("with HOME: %q", got)
	}
	if got := (State{Dir: "here"}).StateDir(); got != "here" {
		t.Errorf("state.dir set: %q", got)
	}
}

// engines[].roles lists the roles an engine can play: known roles, each once, its role among
// them; a member with one role and no role of its own takes it.
func TestEngineRoles(t *testing.T) {
	for src, want := range map[string]string{
		"engines:\n  - {id: a, address: \"127.0.0.1:1\", role: prefill, roles: [decode]}\n  - {id: b, address: \"127.0.0.1:2\", role: decode}\n":           "engines[0].role: prefill is not one of the roles the engine can play (decode)",
		"engines:\n  - {id: a, address: \"127.0.0.1:1\", role: prefill, roles: [prefill, encode]}\n  - {id: b, address: \"127.0.0.1:2\", role: decode}\n":  "engines[0].roles[1]",
		"engines:\n  - {id: a, address: \"127.0.0.1:1\", role: prefill, roles: [prefill, prefill]}\n  - {id: b, address: \"127.0.0.1:2\", role: decode}\n": "engines[0].roles[1]: prefill is listed twice",
	} {
		if _, err := Load([]byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
	cfg := mustLoad(t, "engines:\n  - {id: a, address: \"127.0.0.1:1\", role: prefill, roles: [prefill]}\n  - {id: b, address: \"127.0.0.1:2\", role: decode, roles: [prefill, decode]}\n")
	if cfg.Engines[0].OnlyRole() != RolePrefill || cfg.Engines[1].OnlyRole() != "" {
		t.Fatalf("%+v", cfg.Engines)
	}
	if err := cfg.CheckMember(Engine{ID: "s", Address: "10.0.0.1:8000", Profile: DefaultProfileName, Roles: []string{RoleDecode}}); err != nil {
		t.Fatalf("a member that can play decode only, with no role: %v", err)
	}
}
