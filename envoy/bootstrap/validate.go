package bootstrap

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/narwhal-llm/narwhal/config"
	"github.com/narwhal-llm/narwhal/problem"
)

// Validate checks an Envoy v3 bootstrap (YAML or JSON) strictly and returns every
// problem found, nil when there is none:
//
//  1. the YAML converts to JSON strictly (no duplicate keys);
//  2. every key names a field of the Envoy v3 API, every enum value exists, every scalar has the
//     right type and range, and every typed_config "@type" is a known type: checked against the
//     proto descriptors, descending into every Any, then confirmed by protojson.Unmarshal
//     (unknown fields are errors) into bootstrapv3.Bootstrap;
//  3. the proto constraints (protoc-gen-validate ValidateAll) hold for the bootstrap and for the
//     unpacked content of every Any, recursively (the top-level ValidateAll does not descend
//     into Any);
//  4. the lint rules protos cannot see (lint.go): the ext_proc filter is configured the way
//     Narwhal needs, no request Narwhal did not place can reach the ORIGINAL_DST cluster, every
//     referenced cluster exists, subset keys are the ones Narwhal publishes, and, when cfg is
//     not nil, the bootstrap fits that Narwhal config (addresses, body limit, waiting time,
//     waiting-set capacity, paths, cluster prefix).
//
// With a nil cfg only the checks that need no Narwhal config run.
func Validate(data []byte, cfg *config.Config) problem.List {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		p := problem.Problem{Msg: "not valid YAML: " + msg}
		if m := yamlErrLineRE.FindStringSubmatch(msg); m != nil {
			p.Line, _ = strconv.Atoi(m[1])
		}
		return []problem.Problem{p}
	}
	lines := problem.Lines(data)
	var doc any
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return []problem.Problem{{Msg: "not valid YAML: " + err.Error()}}
	}
	if _, ok := doc.(map[string]any); !ok {
		return []problem.Problem{{Msg: "the document must be a mapping (an Envoy bootstrap), got " + jsonKind(doc)}}
	}

	sw := &schemaWalker{written: map[string]string{"": ""}}
	sw.message(doc, (&bootstrapv3.Bootstrap{}).ProtoReflect().Descriptor(), "", "")
	if len(sw.problems) > 0 {
		return sw.finish(sw.problems, lines)
	}

	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
		return []problem.Problem{protojsonProblem(err, js, lines)}
	}

	problems := validateTree(&b)
	problems = append(problems, lintBootstrap(&b, cfg)...)
	return sw.finish(problems, lines)
}

var yamlErrLineRE = regexp.MustCompile(`line (\d+)`)

// finish rewrites canonical paths (proto field names) to the keys as written in the document
// (a field written in lowerCamelCase stays so) and attaches line numbers.
func (w *schemaWalker) finish(ps []problem.Problem, lines map[string]int) []problem.Problem {
	if len(ps) == 0 {
		return nil
	}
	out := make([]problem.Problem, 0, len(ps))
	for _, p := range ps {
		for q := p.Path; ; q = problem.Parent(q) {
			if wr, ok := w.written[q]; ok {
				p.Path = wr + p.Path[len(q):]
				if p.Line == 0 {
					p.Line = lines[wr]
				}
				break
			}
			if q == "" {
				break
			}
		}
		out = append(out, p)
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// Descriptor-guided check of the JSON document: every problem at once, with its path.

// schemaWalker checks a JSON value against a message descriptor the way protojson reads it,
// reporting every unknown field, bad enum value, wrong type and unknown Any type. It records,
// for every field it visits, the path as written (JSON or proto field names) under its
// canonical path (proto field names).
type schemaWalker struct {
	problems []problem.Problem
	written  map[string]string
}

func (w *schemaWalker) add(path, format string, args ...any) {
	w.problems = append(w.problems, problem.Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (w *schemaWalker) message(v any, md protoreflect.MessageDescriptor, canon, written string) {
	if v == nil {
		return // null: the field is unset
	}
	switch md.FullName() {
	case "google.protobuf.Any":
		w.anyValue(v, canon, written)
		return
	case "google.protobuf.Duration":
		w.duration(v, written)
		return
	case "google.protobuf.Timestamp", "google.protobuf.FieldMask":
		if _, ok := v.(string); !ok {
			w.add(written, "must be a string (%s), got %s", md.Name(), jsonKind(v))
		}
		return
	case "google.protobuf.Value":
		return // any JSON value
	case "google.protobuf.Struct":
		if _, ok := v.(map[string]any); !ok {
			w.add(written, "must be a mapping, got %s", jsonKind(v))
		}
		return
	case "google.protobuf.ListValue":
		if _, ok := v.([]any); !ok {
			w.add(written, "must be a list, got %s", jsonKind(v))
		}
		return
	case "google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		w.scalar(v, md.Fields().ByName("value"), written)
		return
	}
	obj, ok := v.(map[string]any)
	if !ok {
		w.add(written, "must be a mapping (%s), got %s", md.FullName(), jsonKind(v))
		return
	}
	w.fields(obj, md, canon, written, nil)
}

// fields checks the members of an object read as message md, skipping the keys in skip.
func (w *schemaWalker) fields(obj map[string]any, md protoreflect.MessageDescriptor, canon, written string, skip map[string]bool) {
	seen := map[protoreflect.FieldNumber]string{}
	oneofs := map[protoreflect.FullName]string{}
	for _, k := range sortedKeys(obj) {
		if skip[k] {
			continue
		}
		wk := problem.Key(written, k)
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(k))
		}
		if fd == nil {
			msg := fmt.Sprintf("unknown field %q in %s", k, md.FullName())
			if s := problem.Suggest(k, fieldNames(md)); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			w.problems = append(w.problems, problem.Problem{Path: wk, Msg: msg})
			continue
		}
		if prev, dup := seen[fd.Number()]; dup {
			w.add(wk, "field %s is set twice (also as %q)", fd.Name(), prev)
			continue
		}
		seen[fd.Number()] = k
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && obj[k] != nil {
			if prev, set := oneofs[od.FullName()]; set {
				w.add(wk, "only one of the %s fields may be set, and %q is already set", od.Name(), prev)
				continue
			}
			oneofs[od.FullName()] = k
		}
		ck := problem.Key(canon, string(fd.Name()))
		w.written[ck] = wk
		w.field(obj[k], fd, ck, wk)
	}
}

func (w *schemaWalker) field(v any, fd protoreflect.FieldDescriptor, canon, written string) {
	if v == nil {
		return
	}
	switch {
	case fd.IsList():
		list, ok := v.([]any)
		if !ok {
			w.add(written, "must be a list, got %s", jsonKind(v))
			return
		}
		for i, e := range list {
			ci, wi := problem.Index(canon, i), problem.Index(written, i)
			w.written[ci] = wi
			w.single(e, fd, ci, wi)
		}
	case fd.IsMap():
		obj, ok := v.(map[string]any)
		if !ok {
			w.add(written, "must be a mapping, got %s", jsonKind(v))
			return
		}
		for _, k := range sortedKeys(obj) {
			ck, wk := problem.Key(canon, k), problem.Key(written, k)
			w.written[ck] = wk
			switch fd.MapKey().Kind() {
			case protoreflect.StringKind:
			case protoreflect.BoolKind:
				if k != "true" && k != "false" {
					w.add(wk, "map key must be true or false, got %q", k)
				}
			default:
				if _, err := strconv.ParseInt(k, 10, 64); err != nil {
					w.add(wk, "map key must be an integer, got %q", k)
				}
			}
			w.single(obj[k], fd.MapValue(), ck, wk)
		}
	default:
		w.single(v, fd, canon, written)
	}
}

func (w *schemaWalker) single(v any, fd protoreflect.FieldDescriptor, canon, written string) {
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		w.message(v, fd.Message(), canon, written)
		return
	}
	w.scalar(v, fd, written)
}

func (w *schemaWalker) anyValue(v any, canon, written string) {
	obj, ok := v.(map[string]any)
	if !ok {
		w.add(written, "must be a mapping with an \"@type\", got %s", jsonKind(v))
		return
	}
	t, ok := obj["@type"].(string)
	if !ok {
		if _, present := obj["@type"]; present {
			w.add(problem.Key(written, "@type"), "must be a string (a type URL)")
		} else {
			w.add(written, "missing \"@type\": a typed_config names its type, e.g. \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router")
		}
		return
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByURL(t)
	if err != nil {
		w.add(problem.Key(written, "@type"), "unknown type %q (not an Envoy v3 API type this validator knows)", t)
		return
	}
	md := mt.Descriptor()
	if hasCustomJSON(md) {
		for _, k := range sortedKeys(obj) {
			if k != "@type" && k != "value" {
				w.add(problem.Key(written, k), "unknown field %q: a %s in an Any is written as {\"@type\": ..., \"value\": ...}", k, md.FullName())
			}
		}
		ck, wk := problem.Key(canon, "value"), problem.Key(written, "value")
		w.written[ck] = wk
		w.message(obj["value"], md, ck, wk)
		return
	}
	w.fields(obj, md, canon, written, map[string]bool{"@type": true})
}

// hasCustomJSON reports the well-known types protojson writes as something other than an
// object of their fields; inside an Any they go under "value".
func hasCustomJSON(md protoreflect.MessageDescriptor) bool {
	if md.ParentFile().Package() != "google.protobuf" {
		return false
	}
	switch md.Name() {
	case "Any", "Timestamp", "Duration", "Struct", "ListValue", "Value", "FieldMask", "Empty",
		"DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value",
		"BoolValue", "StringValue", "BytesValue":
		return true
	}
	return false
}

var durationRE = regexp.MustCompile(`^(-)?([0-9]+)(?:\.([0-9]{1,9}))?s$`)

func (w *schemaWalker) duration(v any, written string) {
	s, ok := v.(string)
	if !ok {
		w.add(written, "must be a duration string such as \"35s\" or \"0.5s\", got %s", jsonKind(v))
		return
	}
	m := durationRE.FindStringSubmatch(s)
	if m == nil {
		w.add(written, "must be a duration such as \"35s\" or \"0.5s\" (seconds with an \"s\" suffix), got %q", s)
		return
	}
	if sec, err := strconv.ParseInt(m[2], 10, 64); err != nil || sec > 315576000000 {
		w.add(written, "duration %q is out of range", s)
	}
}

func (w *schemaWalker) scalar(v any, fd protoreflect.FieldDescriptor, written string) {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.FullName() == "google.protobuf.NullValue" {
			w.add(written, "must be null")
			return
		}
		switch x := v.(type) {
		case string:
			if ed.Values().ByName(protoreflect.Name(x)) == nil {
				var names []string
				for i := 0; i < ed.Values().Len(); i++ {
					names = append(names, string(ed.Values().Get(i).Name()))
				}
				msg := fmt.Sprintf("invalid value %q for enum %s (one of %s)", x, ed.Name(), strings.Join(names, ", "))
				if s := problem.Suggest(x, names); s != "" {
					msg += fmt.Sprintf("; did you mean %s?", s)
				}
				w.problems = append(w.problems, problem.Problem{Path: written, Msg: msg})
			}
		case json.Number:
			if _, err := strconv.ParseInt(x.String(), 10, 32); err != nil {
				w.add(written, "invalid enum number %s for %s", x, ed.Name())
			}
		default:
			w.add(written, "must be an enum name of %s, got %s", ed.Name(), jsonKind(v))
		}
	case protoreflect.BoolKind:
		if _, ok := v.(bool); !ok {
			w.add(written, "must be true or false, got %s", jsonKind(v))
		}
	case protoreflect.StringKind:
		if _, ok := v.(string); !ok {
			w.add(written, "must be a string, got %s (quote it)", jsonKind(v))
		}
	case protoreflect.BytesKind:
		s, ok := v.(string)
		if !ok {
			w.add(written, "must be a base64 string, got %s", jsonKind(v))
			return
		}
		if !isBase64(s) {
			w.add(written, "must be base64, got %q", s)
		}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		w.integer(v, written, "a 32-bit integer", -1<<31, 1<<31-1, false)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		w.integer(v, written, "a 64-bit integer", -1<<63, 1<<63-1, false)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		w.integer(v, written, "an unsigned 32-bit integer", 0, 1<<32-1, false)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		w.integer(v, written, "an unsigned 64-bit integer", 0, 0, true)
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		var s string
		switch x := v.(type) {
		case json.Number:
			s = x.String()
		case string:
			if x == "NaN" || x == "Infinity" || x == "-Infinity" {
				return
			}
			s = x
		default:
			w.add(written, "must be a number, got %s", jsonKind(v))
			return
		}
		bits := 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		if _, err := strconv.ParseFloat(s, bits); err != nil {
			w.add(written, "must be a number, got %q", s)
		}
	}
}

// integer checks an integer written as a JSON number or string, within [lo, hi] (or any
// unsigned 64-bit value when u64).
func (w *schemaWalker) integer(v any, written, what string, lo, hi int64, u64 bool) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case string:
		s = x
	default:
		w.add(written, "must be %s, got %s", what, jsonKind(v))
		return
	}
	if u64 {
		if _, err := strconv.ParseUint(s, 10, 64); err == nil {
			return
		}
	} else if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < lo || n > hi {
			w.add(written, "%s is out of range: must be %s (%d to %d)", s, what, lo, hi)
		}
		return
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f == float64(int64(f)) {
		if u64 && f >= 0 || !u64 && f >= float64(lo) && f <= float64(hi) {
			return // an integral number in exponent form, which protojson accepts
		}
		w.add(written, "%s is out of range: must be %s", s, what)
		return
	}
	if _, ok := v.(string); ok {
		w.add(written, "must be %s, got %q", what, s)
		return
	}
	w.add(written, "must be %s, got %s", what, s)
}

func isBase64(s string) bool {
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("+/-_=", r)) {
			return false
		}
	}
	return true
}

func jsonKind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return fmt.Sprintf("string %q", x)
	case json.Number:
		return "number " + x.String()
	case bool:
		return strconv.FormatBool(x)
	}
	return fmt.Sprintf("%T", v)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func fieldNames(md protoreflect.MessageDescriptor) []string {
	names := make([]string, md.Fields().Len())
	for i := range names {
		names[i] = string(md.Fields().Get(i).Name())
	}
	return names
}

// ---------------------------------------------------------------------------------------------
// protojson errors the descriptor walk did not foresee: mapped to the path at their position.

// protojsonErrRE splits a protojson error; protobuf-go puts a random choice of ASCII or
// non-breaking spaces after "proto:" on purpose, so both are accepted.
var protojsonErrRE = regexp.MustCompile(`^proto:[\s\x{00a0}]*(?:\(line (\d+):(\d+)\):[\s\x{00a0}]*)?(.*)$`)

func protojsonProblem(err error, js []byte, lines map[string]int) problem.Problem {
	msg := err.Error()
	m := protojsonErrRE.FindStringSubmatch(msg)
	if m == nil {
		return problem.Problem{Msg: msg}
	}
	msg = m[3]
	if m[1] == "" {
		return problem.Problem{Msg: msg}
	}
	line, _ := strconv.Atoi(m[1])
	col, _ := strconv.Atoi(m[2])
	off := 0
	for l := 1; l < line && off < len(js); l++ { // json.Marshal output is one line, but be general
		i := bytes.IndexByte(js[off:], '\n')
		if i < 0 {
			break
		}
		off += i + 1
	}
	for c := 1; c < col && off < len(js); c++ { // columns count runes
		_, size := utf8.DecodeRune(js[off:])
		off += size
	}
	path := jsonPathAt(js, off)
	return problem.Problem{Path: path, Msg: msg, Line: lines[path]}
}

// jsonPathAt returns the path of the member whose key or value starts at byte offset off of a
// JSON document, or else of the innermost value containing it. It walks encoding/json's tokens
// (the document is valid JSON: converted from YAML), each with its offsets.
func jsonPathAt(js []byte, off int) string {
	type frame struct {
		path    string
		obj     bool
		wantKey bool   // objects: the next token is a key (or the end)
		member  string // objects: the path of the member whose value comes next
		n       int    // arrays: the next element's index
		start   int
	}
	var stack []frame
	best, exact, span := "", false, len(js)+1
	hit := func(path string, start int) {
		if start == off && !exact {
			best, exact = path, true
		}
	}
	contains := func(path string, start, end int) {
		if !exact && start <= off && off < end && end-start < span {
			best, span = path, end-start
		}
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	for prev := 0; ; {
		tok, err := dec.Token()
		if err != nil {
			return best
		}
		end := int(dec.InputOffset())
		start := prev
		for start < end && strings.IndexByte(" \t\r\n,:", js[start]) >= 0 {
			start++
		}
		prev = end
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			f := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			contains(f.path, f.start, end)
			continue
		}
		path := ""
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			switch {
			case top.obj && top.wantKey:
				top.member, top.wantKey = problem.Key(top.path, tok.(string)), false
				hit(top.member, start)
				continue
			case top.obj:
				path, top.wantKey = top.member, true
			default:
				path = problem.Index(top.path, top.n)
				top.n++
			}
		}
		hit(path, start)
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, frame{path: path, obj: d == '{', wantKey: d == '{', start: start})
			continue
		}
		contains(path, start, end)
	}
}

// ---------------------------------------------------------------------------------------------
// Proto constraints: ValidateAll on the bootstrap and on the content of every Any, recursively.

// validateTree runs ValidateAll on m and on the unpacked content of every Any under it (at any
// depth, including Anys inside unpacked Anys), returning the problems under canonical paths.
func validateTree(m proto.Message) []problem.Problem {
	var out []problem.Problem
	var visit func(m proto.Message, path string)
	visit = func(m proto.Message, path string) {
		if v, ok := m.(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				pgvProblems(err, m.ProtoReflect(), path, &out)
			}
		}
		eachAny(m.ProtoReflect(), path, func(a *anypb.Any, p string) {
			inner, err := a.UnmarshalNew()
			if err != nil {
				out = append(out, problem.Problem{Path: p, Msg: "cannot unpack " + a.GetTypeUrl() + ": " + err.Error()})
				return
			}
			visit(inner, p)
		})
	}
	visit(m, "")
	return out
}

// eachAny calls f for every populated Any field under m (not descending into the Anys: f
// does), in field order, with its canonical path.
func eachAny(m protoreflect.Message, path string, f func(*anypb.Any, string)) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.Message() == nil || !m.Has(fd) {
			continue
		}
		p := problem.Key(path, string(fd.Name()))
		msg := func(v protoreflect.Value, p string) {
			sub := v.Message()
			if a, ok := sub.Interface().(*anypb.Any); ok {
				f(a, p)
				return
			}
			eachAny(sub, p, f)
		}
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			for j := 0; j < l.Len(); j++ {
				msg(l.Get(j), problem.Index(p, j))
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				continue
			}
			mp := m.Get(fd).Map()
			var keys []string
			vals := map[string]protoreflect.Value{}
			mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				keys = append(keys, k.String())
				vals[k.String()] = v
				return true
			})
			sort.Strings(keys)
			for _, k := range keys {
				msg(vals[k], problem.Key(p, k))
			}
		default:
			msg(m.Get(fd), p)
		}
	}
}

// pgvField is a protoc-gen-validate field error; pgvMulti a list of them.
type pgvField interface {
	Field() string
	Reason() string
	Cause() error
	Key() bool
}

type pgvMulti interface{ AllErrors() []error }

// pgvProblems turns a ValidateAll error of message m at path into problems, following embedded
// message errors down to the field that failed.
func pgvProblems(err error, m protoreflect.Message, path string, out *[]problem.Problem) {
	if multi, ok := err.(pgvMulti); ok {
		for _, e := range multi.AllErrors() {
			pgvProblems(e, m, path, out)
		}
		return
	}
	fe, ok := err.(pgvField)
	if !ok {
		*out = append(*out, problem.Problem{Path: path, Msg: err.Error()})
		return
	}
	name, sub, indexed := strings.Cut(fe.Field(), "[")
	sub = strings.TrimSuffix(sub, "]")
	md := m.Descriptor()
	fd := pgvFieldByGoName(md, name)
	var p string
	switch {
	case fd != nil:
		p = problem.Key(path, string(fd.Name()))
	default:
		p = problem.Key(path, snakeCase(name))
		if od := pgvOneofByGoName(md, name); od != nil {
			p = problem.Key(path, string(od.Name()))
		}
	}
	if indexed {
		if fd != nil && fd.IsList() {
			if n, err := strconv.Atoi(sub); err == nil {
				p = problem.Index(p, n)
			}
		} else {
			p = problem.Key(p, sub)
		}
	}
	cause := fe.Cause()
	if cause != nil && fd != nil && fd.Message() != nil && (isType[pgvMulti](cause) || isType[pgvField](cause)) {
		if child, ok := pgvChild(m, fd, sub, indexed); ok {
			pgvProblems(cause, child, p, out)
			return
		}
	}
	msg := fe.Reason()
	if fe.Key() {
		msg = "key " + msg
	}
	if cause != nil {
		msg += ": " + cause.Error()
	}
	*out = append(*out, problem.Problem{Path: p, Msg: msg})
}

func isType[T any](err error) bool {
	_, ok := err.(T)
	return ok
}

func pgvChild(m protoreflect.Message, fd protoreflect.FieldDescriptor, sub string, indexed bool) (protoreflect.Message, bool) {
	switch {
	case fd.IsList() && indexed:
		n, err := strconv.Atoi(sub)
		l := m.Get(fd).List()
		if err != nil || n < 0 || n >= l.Len() {
			return nil, false
		}
		return l.Get(n).Message(), true
	case fd.IsMap() && indexed:
		if fd.MapKey().Kind() != protoreflect.StringKind || fd.MapValue().Message() == nil {
			return nil, false
		}
		v := m.Get(fd).Map().Get(protoreflect.ValueOfString(sub).MapKey())
		if !v.IsValid() {
			return nil, false
		}
		return v.Message(), true
	case !fd.IsList() && !fd.IsMap():
		return m.Get(fd).Message(), true
	}
	return nil, false
}

func goNameMatches(protoName, goName string) bool {
	return strings.EqualFold(strings.ReplaceAll(protoName, "_", ""), goName)
}

func pgvFieldByGoName(md protoreflect.MessageDescriptor, goName string) protoreflect.FieldDescriptor {
	for i := 0; i < md.Fields().Len(); i++ {
		if fd := md.Fields().Get(i); goNameMatches(string(fd.Name()), goName) {
			return fd
		}
	}
	return nil
}

func pgvOneofByGoName(md protoreflect.MessageDescriptor, goName string) protoreflect.OneofDescriptor {
	for i := 0; i < md.Oneofs().Len(); i++ {
		if od := md.Oneofs().Get(i); goNameMatches(string(od.Name()), goName) {
			return od
		}
	}
	return nil
}

func snakeCase(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
