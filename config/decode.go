package config

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/narwhal-llm/narwhal/problem"
)

// YAML short tags the decoder tells apart.
const (
	tagNull  = "!!null"
	tagBool  = "!!bool"
	tagStr   = "!!str"
	tagInt   = "!!int"
	tagFloat = "!!float"
	tagMerge = "!!merge"
)

// defaulter is implemented by the types whose new map or list entries (or newly allocated
// pointers) start from defaults other than their zero value (see defaults.go).
type defaulter interface{ setDefaults() }

// decoder decodes a yaml.Node tree onto a Go value by reflection, using the yaml struct
// tags, and collects every problem instead of stopping at the first.
type decoder struct {
	problems []problem.Problem
	// tainted lists the paths whose values could not be decoded; validation says nothing
	// about them or about rules that depend on them.
	tainted []string
	// budget bounds the work, so that aliases expanding a node many times over cannot make
	// decoding quadratic; exhausted is set once it or maxProblems runs out, and then
	// decoding stops and validation is skipped.
	budget    int
	exhausted bool
}

func newDecoder(root *yaml.Node) *decoder {
	return &decoder{budget: 8*countNodes(root) + 10000}
}

// countNodes counts the nodes of the tree without following aliases.
func countNodes(root *yaml.Node) int {
	n := 0
	stack := []*yaml.Node{root}
	for len(stack) > 0 {
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n++
		stack = append(stack, top.Content...)
	}
	return n
}

// maxProblems bounds the problems decoding reports, so that a hostile document cannot turn
// into millions of lines; no real config comes near it.
const maxProblems = 1000

// note records a problem that leaves the decoded value meaningful (an unknown key).
func (d *decoder) note(path, msg string) {
	if d.exhausted {
		return
	}
	d.problems = append(d.problems, problem.Problem{Path: path, Msg: msg})
	if len(d.problems) == maxProblems {
		d.stop(fmt.Sprintf("too many problems; stopped after %d", maxProblems))
	}
}

// stop ends decoding with a last problem; validation is skipped.
func (d *decoder) stop(msg string) {
	d.problems = append(d.problems, problem.Problem{Msg: msg})
	d.exhausted = true
}

// fail records a problem with the value at path itself, and taints the path.
func (d *decoder) fail(path, msg string) {
	d.note(path, msg)
	d.tainted = append(d.tainted, path)
}

// spend takes one unit of work from the budget and reports whether decoding may go on.
func (d *decoder) spend() bool {
	if d.exhausted {
		return false
	}
	d.budget--
	if d.budget < 0 {
		d.stop("the document expands to too many values (aliases used over and over); write it out plainly")
		return false
	}
	return true
}

// document decodes the root of a parsed document onto cfg.
func (d *decoder) document(root *yaml.Node, cfg *Config) {
	n := root
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		n = n.Content[0]
	}
	n = deref(n)
	switch {
	case n == nil:
		d.fail("", "the document is an alias that does not resolve")
	case isNull(n):
	case n.Kind != yaml.MappingNode:
		d.fail("", fmt.Sprintf("line %d: the config must be a mapping of keys, found %s", n.Line, describe(n)))
	default:
		d.value(n, reflect.ValueOf(cfg).Elem(), "")
	}
}

// deref follows aliases to the node they name; nil when an alias does not resolve.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 100 {
			return nil
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull }

// value decodes n onto v. A null keeps v as it is (its default), except that it clears a
// pointer (a profile curve: null means "no curve").
func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	if !d.spend() {
		return
	}
	n = deref(n)
	if n == nil {
		d.fail(path, "alias does not resolve to a value")
		return
	}
	if isNull(n) {
		if v.Kind() == reflect.Pointer {
			v.SetZero()
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		d.pointer(n, v, path)
	case reflect.Struct:
		d.structure(n, v, path)
	case reflect.Map:
		d.mapping(n, v, path)
	case reflect.Slice:
		d.sequence(n, v, path)
	default:
		d.scalar(n, v, path)
	}
}

// setDefaults applies the type's own defaults to a new entry, when it has any.
func setDefaults(ptr reflect.Value) {
	if dv, ok := ptr.Interface().(defaulter); ok {
		dv.setDefaults()
	}
}

// pointer decodes a mapping onto the struct v points to, allocating it (with its
// defaults) when v is nil and decoding onto the existing value otherwise.
func (d *decoder) pointer(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.wrongType(path, v.Type(), n)
		return
	}
	if v.IsNil() {
		p := reflect.New(v.Type().Elem())
		setDefaults(p)
		v.Set(p)
	}
	d.value(n, v.Elem(), path)
}

// structure decodes a mapping onto a struct, key by key, by yaml tag.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.wrongType(path, v.Type(), n)
		return
	}
	names, index := fields(v.Type())
	for _, e := range d.entries(n, path) {
		i, ok := index[e.name]
		if !ok {
			d.note(problem.Key(path, e.name), unknownKey(e.name, names))
			continue
		}
		d.value(e.val, v.Field(i), problem.Key(path, e.name))
	}
}

// fields lists a struct's yaml keys in declaration order and maps each to its field index.
func fields(t reflect.Type) ([]string, map[string]int) {
	var names []string
	index := make(map[string]int)
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		names = append(names, name)
		index[name] = i
	}
	return names, index
}

// unknownKey words the problem of a key the schema lacks, suggesting a close one.
func unknownKey(key string, known []string) string {
	if s := problem.Suggest(key, known); s != "" {
		return fmt.Sprintf("unknown key (did you mean %q?)", s)
	}
	return "unknown key; known keys: " + strings.Join(known, ", ")
}

// mapping decodes a YAML mapping into a Go map with string keys. An entry under an existing
// key is decoded onto the existing value; a new one starts from its type's defaults.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.wrongType(path, v.Type(), n)
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for _, e := range d.entries(n, path) {
		key := reflect.ValueOf(e.name).Convert(v.Type().Key())
		elem := reflect.New(v.Type().Elem()).Elem()
		if old := v.MapIndex(key); old.IsValid() {
			elem.Set(old)
		} else {
			setDefaults(elem.Addr())
		}
		d.value(e.val, elem, problem.Key(path, e.name))
		v.SetMapIndex(key, elem)
	}
}

// sequence decodes a YAML sequence into a slice, which replaces the default list. Each
// element starts from its type's defaults.
func (d *decoder) sequence(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.wrongType(path, v.Type(), n)
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		elem := s.Index(i)
		setDefaults(elem.Addr())
		d.value(item, elem, problem.Index(path, i))
	}
	v.Set(s)
}

// scalar decodes a scalar onto a string, bool, integer or float, strictly by YAML type: a
// quoted number is not a number, and a float is not an integer.
func (d *decoder) scalar(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.wrongType(path, v.Type(), n)
		return
	}
	tag := n.ShortTag()
	switch v.Kind() {
	case reflect.String:
		if tag != tagStr {
			d.fail(path, fmt.Sprintf("expected a string, found %s (quote it to make it a string)", describe(n)))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if tag != tagBool || n.Decode(&b) != nil {
			d.wrongType(path, v.Type(), n)
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		d.integer(n, v, path)
	case reflect.Float32, reflect.Float64:
		d.float(n, v, path)
	default:
		d.fail(path, fmt.Sprintf("cannot decode into Go type %s", v.Type()))
	}
}

func (d *decoder) integer(n *yaml.Node, v reflect.Value, path string) {
	if n.ShortTag() != tagInt {
		d.wrongType(path, v.Type(), n)
		return
	}
	var i int64
	if err := n.Decode(&i); err != nil || v.OverflowInt(i) {
		d.fail(path, fmt.Sprintf("integer %s is out of range", clip(n.Value)))
		return
	}
	v.SetInt(i)
}

func (d *decoder) float(n *yaml.Node, v reflect.Value, path string) {
	if tag := n.ShortTag(); tag != tagInt && tag != tagFloat {
		d.wrongType(path, v.Type(), n)
		return
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		d.fail(path, fmt.Sprintf("expected a number, found %s", describe(n)))
		return
	}
	if math.IsNaN(f) || math.IsInf(f, 0) || v.OverflowFloat(f) {
		d.fail(path, fmt.Sprintf("must be a finite number, got %s", clip(n.Value)))
		return
	}
	v.SetFloat(f)
}

// wrongType records that the node at path is not of the kind the schema expects there.
func (d *decoder) wrongType(path string, want reflect.Type, n *yaml.Node) {
	d.fail(path, fmt.Sprintf("expected %s, found %s", expected(want), describe(n)))
}

// expected names what a Go type accepts, for messages.
func expected(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer, reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean (true or false)"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// describe names what a node is, for messages: `a list`, `string "abc"`, `float 1.5`.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch tag := n.ShortTag(); tag {
	case tagStr:
		return "string " + strconv.Quote(clip(n.Value))
	case tagInt:
		return "integer " + clip(n.Value)
	case tagFloat:
		return "float " + clip(n.Value)
	case tagBool:
		return "boolean " + clip(n.Value)
	case tagNull:
		return "null"
	case "!!timestamp":
		return "timestamp " + clip(n.Value)
	default:
		return fmt.Sprintf("%q tagged %s", clip(n.Value), clip(tag))
	}
}

// clip shortens a value quoted in a message.
func clip(s string) string {
	const limit = 40
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	return string(r[:limit]) + "..."
}

// IsName reports whether s is non-empty and made only of [A-Za-z0-9._-]: an engine id or a
// profile name.
func IsName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// entry is one key of a mapping, after merge keys are expanded.
type entry struct {
	name string
	val  *yaml.Node
}

// entries lists the keys of mapping n in document order. It reports duplicate keys (the
// first one counts) and keys that are not scalars, and expands merge keys ("<<: *anchor"):
// a merged key is used unless the mapping sets it itself.
func (d *decoder) entries(n *yaml.Node, path string) []entry {
	return d.collect(n, path, true, map[*yaml.Node]bool{})
}

// collect does the work of entries; report is false while expanding a merge source, whose
// own problems belong where it is defined. visiting guards against merge cycles.
func (d *decoder) collect(n *yaml.Node, path string, report bool, visiting map[*yaml.Node]bool) []entry {
	visiting[n] = true
	defer delete(visiting, n)
	first := make(map[string]*yaml.Node)
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := deref(n.Content[i]); k != nil && k.Kind == yaml.ScalarNode && k.ShortTag() != tagMerge {
			if first[k.Value] == nil {
				first[k.Value] = n.Content[i]
			}
		}
	}
	var out []entry
	have := make(map[string]bool)
	for i := 0; i+1 < len(n.Content) && d.spend(); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		k := deref(key)
		switch {
		case k == nil || k.Kind != yaml.ScalarNode:
			if report {
				d.note(path, fmt.Sprintf("line %d: a key must be a plain name, found %s", key.Line, describeKey(k)))
			}
		case k.ShortTag() == tagMerge:
			for _, e := range d.merge(val, path, report, visiting) {
				if first[e.name] == nil && !have[e.name] {
					have[e.name] = true
					out = append(out, e)
				}
			}
		case first[k.Value] != key:
			if report {
				d.fail(problem.Key(path, k.Value), fmt.Sprintf("duplicate key (first at line %d)", first[k.Value].Line))
			}
		default:
			have[k.Value] = true
			out = append(out, entry{name: k.Value, val: val})
		}
	}
	return out
}

func describeKey(k *yaml.Node) string {
	if k == nil {
		return "an alias that does not resolve"
	}
	return describe(k)
}

// merge expands the value of a merge key: a mapping, or a list of mappings of which the
// earlier ones win.
func (d *decoder) merge(val *yaml.Node, path string, report bool, visiting map[*yaml.Node]bool) []entry {
	v := deref(val)
	var sources []*yaml.Node
	switch {
	case v != nil && v.Kind == yaml.MappingNode:
		sources = []*yaml.Node{v}
	case v != nil && v.Kind == yaml.SequenceNode:
		for _, item := range v.Content {
			sources = append(sources, deref(item))
		}
	default:
		sources = []*yaml.Node{v}
	}
	var out []entry
	seen := make(map[string]bool)
	for _, src := range sources {
		switch {
		case src == nil || src.Kind != yaml.MappingNode:
			if report {
				d.fail(problem.Key(path, "<<"), fmt.Sprintf("line %d: a merge key needs a mapping or a list of mappings", val.Line))
			}
			continue
		case visiting[src]:
			if report {
				d.fail(problem.Key(path, "<<"), fmt.Sprintf("line %d: a merge key refers to a mapping that contains it", val.Line))
			}
			continue
		}
		for _, e := range d.collect(src, path, false, visiting) {
			if !seen[e.name] {
				seen[e.name] = true
				out = append(out, e)
			}
		}
	}
	return out
}
