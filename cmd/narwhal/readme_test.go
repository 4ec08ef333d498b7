package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/internal/poll"
)

// readme is the README's text.
func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section is the README's text from the heading head to the next heading of its level or above.
func section(t *testing.T, text, head string) string {
	t.Helper()
	i := strings.Index(text, "\n"+head+"\n")
	if i < 0 {
		t.Fatalf("README: no %q", head)
	}
	rest := text[i+len(head)+2:]
	level := strings.Count(strings.Fields(head)[0], "#")
	for _, m := range regexp.MustCompile(`(?m)^#+ `).FindAllStringIndex(rest, -1) {
		if strings.Count(rest[m[0]:m[1]], "#") <= level {
			return rest[:m[0]]
		}
	}
	return rest
}

// The README's config table names keys of the schema, with the defaults the embedded default
// has: each row's keys (`a.b`, `.c` continuing a.b's parent, `a.{b,c}`, `a.*` with `name value`
// defaults) exist in the config, and every default given as a plain value equals the embedded
// default's.
func TestReadmeConfigTable(t *testing.T) {
	cfg, err := config.LoadDefault()
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &tree); err != nil {
		t.Fatal(err)
	}
	flat := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		flat[prefix] = fmt.Sprint(v)
		if m, ok := v.(map[string]any); ok {
			for k, x := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, x)
			}
		}
	}
	walk("", tree)
	code := regexp.MustCompile("`([^`]*)`")
	rows := 0
	for _, line := range strings.Split(section(t, readme(t), "## Configuration"), "\n") {
		cells := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) < 3 {
			continue
		}
		rows++
		var keys []string
		for _, m := range code.FindAllStringSubmatch(cells[0], -1) {
			k := m[1]
			switch {
			case strings.HasPrefix(k, ".") && len(keys) > 0:
				k = keys[0][:strings.LastIndexByte(keys[0], '.')] + k
			case strings.Contains(k, "{"):
				i, j := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
				for _, alt := range strings.Split(k[i+1:j], ",") {
					keys = append(keys, k[:i]+alt+k[j+1:])
				}
				continue
			}
			keys = append(keys, k)
		}
		defaults := code.FindAllStringSubmatch(cells[1], -1)
		for _, k := range keys {
			k = strings.TrimSuffix(strings.TrimSuffix(k, ".NAME"), "[]")
			if _, ok := flat[strings.TrimSuffix(k, ".*")]; !ok {
				t.Errorf("README config table: %s is not a config key", k)
			}
		}
		switch {
		case len(keys) == 1 && strings.HasSuffix(keys[0], ".*"):
			prefix := strings.TrimSuffix(keys[0], "*")
			for _, d := range defaults {
				name, val, ok := strings.Cut(d[1], " ")
				if want, found := flat[prefix+name]; ok && found && !strings.HasPrefix(val, "{") && want != val {
					t.Errorf("README config table: %s%s defaults to %s, the embedded default has %s", prefix, name, val, want)
				}
			}
		case len(keys) == len(defaults):
			for i, k := range keys {
				want, ok := flat[k]
				got := strings.Trim(defaults[i][1], `"`)
				if ok && !strings.HasPrefix(want, "map[") && !strings.HasPrefix(want, "[") && want != got {
					t.Errorf("README config table: %s defaults to %q, the embedded default has %q", k, got, want)
				}
			}
		}
	}
	if rows < 30 {
		t.Fatalf("README config table: %d rows found", rows)
	}
}

// The README's commands table names every command, and every flag it shows exists on its command.
func TestReadmeCommands(t *testing.T) {
	table := section(t, readme(t), "## Commands")
	root := newRoot(nil, nil)
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if !strings.Contains(table, "`narwhal "+c.Name()) {
			t.Errorf("README commands: no row for narwhal %s", c.Name())
		}
	}
	row := regexp.MustCompile("(?m)^\\| `narwhal ([a-z-]+)([^`]*)`")
	flag := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		cmd, _, err := root.Find([]string{m[1]})
		if err != nil || cmd == root {
			t.Errorf("README commands: narwhal %s is not a command", m[1])
			continue
		}
		for _, f := range flag.FindAllStringSubmatch(m[2], -1) {
			if cmd.Flags().Lookup(f[1]) == nil && root.PersistentFlags().Lookup(f[1]) == nil {
				t.Errorf("README commands: narwhal %s has no --%s", m[1], f[1])
			}
		}
	}
}

// The README's /narwhal/state example has the shape of a live answer: every key it shows is in
// the answer with the same JSON kind, and every key of the answer (and of an engine in it) is
// in the example.
func TestReadmeStateExample(t *testing.T) {
	text := section(t, readme(t), "### `/narwhal/state`")
	i, j := strings.Index(text, "```json\n"), strings.LastIndex(text, "```")
	if i < 0 || j <= i {
		t.Fatal("README: no JSON example of /narwhal/state")
	}
	var example map[string]any
	if err := json.Unmarshal([]byte(strings.ReplaceAll(text[i+8:j], "{...}", "{}")), &example); err != nil {
		t.Fatalf("README /narwhal/state example is not JSON: %v", err)
	}
	admin := serveActive(t, "prefill", "decode")
	var live map[string]any
	var err error
	// Once the engines' metrics are read (health.metrics: the first reading follows the start).
	if !poll.Within(10*time.Second, func() bool {
		live, err = getStateAs[map[string]any](admin)
		engines, _ := live["engines"].([]any)
		return err == nil && len(engines) > 0 && engines[0].(map[string]any)["observed"] != nil
	}) {
		t.Fatalf("no live answer with the engines' metrics read: %v %v", live, err)
	}
	kind := func(v any) string { return fmt.Sprintf("%T", v) }
	var same func(path string, ex, lv any)
	same = func(path string, ex, lv any) {
		switch e := ex.(type) {
		case map[string]any:
			l, ok := lv.(map[string]any)
			if !ok {
				t.Errorf("%s: an object in the README, %s live", path, kind(lv))
				return
			}
			for k, v := range e {
				if lvk, ok := l[k]; !ok {
					t.Errorf("%s.%s: in the README, not in a live answer", path, k)
				} else {
					same(path+"."+k, v, lvk)
				}
			}
		case []any:
			l, ok := lv.([]any)
			if !ok {
				t.Errorf("%s: an array in the README, %s live", path, kind(lv))
				return
			}
			if len(e) > 0 && len(l) > 0 {
				same(path+"[0]", e[0], l[0])
			}
		default:
			if lv != nil && kind(ex) != kind(lv) && !(kind(ex) == "string" && ex == "...") {
				t.Errorf("%s: %s in the README, %s live", path, kind(ex), kind(lv))
			}
		}
	}
	same("state", example, live)
	missing := func(path string, ex, lv map[string]any) {
		var keys []string
		for k := range lv {
			if _, ok := ex[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		if len(keys) > 0 {
			t.Errorf("%s: live keys the README example lacks: %v", path, keys)
		}
	}
	missing("state", example, live)
	ee, le := example["engines"].([]any), live["engines"].([]any)
	if len(ee) > 0 && len(le) > 0 {
		missing("state.engines[0]", ee[0].(map[string]any), le[0].(map[string]any))
	}
}

// layerOrder is the order of the layers of docs/development.md: a package imports only from its own layer or
// an earlier one.
var layerOrder = []string{"vocabulary", "core", "edge", "tool"}

// onlyIn are the boundaries drawn inside the layers: an import that only the packages named
// may make, among the vocabulary, core and edge packages (tools and tests are free).
var onlyIn = map[string][]string{
	// An engine's /metrics is read by engineclient's scanner alone (fuzzed against expfmt in
	// its tests): no second parser in the running server.
	"github.com/prometheus/common/expfmt": {},
	// TLS is made from files in tlsfiles alone (listeners with reload and client checks,
	// dialing); ha takes the etcd client's config made there.
	"crypto/tls": {"tlsfiles", "ha"},
}

// The package table of docs/development.md is the rule: every package of the module is in it,
// with a layer, and no package imports one of a later layer (its non-test imports, from go list).
func TestLayers(t *testing.T) {
	const module = "github.com/narwhal-llm/narwhal/"
	b, err := os.ReadFile("../../docs/development.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "| package | layer | what it holds |")
	if start < 0 {
		t.Fatal("docs/development.md: no package table")
	}
	layer := map[string]int{}
	for _, line := range strings.Split(text[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		cells := strings.Split(line, "|")
		at := slices.Index(layerOrder, strings.TrimSpace(cells[2]))
		if len(cells) < 4 || at < 0 {
			t.Fatalf("docs/development.md package table: bad row %q (layers: %v)", line, layerOrder)
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			layer[m[1]] = at
		}
	}
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		from, ok := layer[pkg]
		if !ok {
			t.Errorf("package %s is not in the package table of docs/development.md: add it with its layer", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if allowed, ruled := onlyIn[imp]; ruled && from < slices.Index(layerOrder, "tool") && !slices.Contains(allowed, pkg) {
				t.Errorf("%s imports %s, which only %v may (onlyIn)", pkg, imp, allowed)
			}
			dep, ours := strings.CutPrefix(imp, module)
			if !ours {
				continue
			}
			if to, ok := layer[dep]; ok && to > from {
				t.Errorf("%s (%s) imports %s (%s): a later layer; docs/development.md's table says %s", pkg, layerOrder[from], dep, layerOrder[to], strings.Join(layerOrder, " < "))
			}
		}
	}
}
