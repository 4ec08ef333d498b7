// Package problem is how Narwhal reports what is wrong with a document it reads — its own config
// (package config) or an Envoy bootstrap (package envoy/bootstrap): a Problem is a path to the
// key and what is wrong there, a List is every problem of a document, Suggest is the did-you-mean
// of an unknown key, and Key, Index and Fields build the paths, which Lines maps back to the
// document's lines. One path syntax for both: map keys and field names joined by dots, list
// indices in brackets, and a key that is not a plain word quoted in brackets
// (`profiles["llama-3.1-8b"].prefill.base_s`, `typed_per_filter_config["envoy.filters.http.ext_proc"]`).
package problem

import (
	"strconv"
	"strings"
)

// Problem is one thing wrong with a document: the path of the key (Key, Index, Fields) and what
// is wrong with it. Path is empty for problems of the document as a whole (a syntax error).
type Problem struct {
	Path string
	Msg  string
	// Line is the 1-based line of the document where Path (or its nearest ancestor written in
	// it) is, 0 when unknown. String does not print it.
	Line int
}

// String renders the problem as one line, "path: what is wrong".
func (p Problem) String() string {
	if p.Path == "" {
		return p.Msg
	}
	return p.Path + ": " + p.Msg
}

// List is every problem found in a document, in a deterministic order. As an error it prints
// one line per problem.
type List []Problem

func (l List) Error() string {
	lines := make([]string, len(l))
	for i, p := range l {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Key appends a map key or field name to a path: ".k" for a plain word (letters, digits, "_",
// "-", "@"), `["k"]` for any other key (one with dots, spaces or nothing at all).
func Key(path, k string) string {
	if plain(k) {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	return path + "[" + strconv.Quote(k) + "]"
}

func plain(k string) bool {
	return k != "" && strings.IndexFunc(k, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '@' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0
}

// Index appends a list index to a path.
func Index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// Fields appends a dotted chain of plain field names to a path.
func Fields(path, fields string) string {
	if path == "" {
		return fields
	}
	return path + "." + fields
}

// Parent strips the last component of a path ("" for a top-level one).
func Parent(p string) string {
	if strings.HasSuffix(p, "]") {
		if strings.HasSuffix(p, "\"]") { // a quoted key: find its opening `["`
			if i := strings.LastIndex(p[:len(p)-2], "[\""); i >= 0 {
				return p[:i]
			}
		}
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// Suggest returns the candidate an unknown key s is most likely a typo of, or "": one equal to
// it ignoring case and underscores, else the closest within an edit distance of 2 (ignoring
// case) that is not a rewrite of the whole candidate. Keys longer than 64 bytes get none.
func Suggest(s string, candidates []string) string {
	if len(s) > 64 {
		return ""
	}
	norm := func(x string) string { return strings.ToLower(strings.ReplaceAll(x, "_", "")) }
	best, bestD := "", 3
	for _, c := range candidates {
		if norm(c) == norm(s) {
			return c
		}
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d < bestD && d < len(c) {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
