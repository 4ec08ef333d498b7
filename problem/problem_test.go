package problem

import "testing"

func TestPaths(t *testing.T) {
	for _, c := range []struct{ path, key, want string }{
		{"", "static_resources", "static_resources"},
		{"a", "b_c", "a.b_c"},
		{"a", "@type", "a.@type"},
		{"a", "narwhal-extproc", "a.narwhal-extproc"},
		{"a", "envoy.lb", `a["envoy.lb"]`},
		{"a", `we"ird]`, `a["we\"ird]"]`},
	} {
		if got := Key(c.path, c.key); got != c.want {
			t.Errorf("Key(%q, %q) = %q, want %q", c.path, c.key, got, c.want)
		}
	}
	for _, c := range []struct{ path, want string }{
		{"a", ""},
		{"a.b", "a"},
		{"a.b[3]", "a.b"},
		{`a.b["envoy.lb"]`, "a.b"},
		{`a["x.y"].c`, `a["x.y"]`},
		{`a["x.y"][2]`, `a["x.y"]`},
	} {
		if got := Parent(c.path); got != c.want {
			t.Errorf("Parent(%q) = %q, want %q", c.path, got, c.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	names := []string{"processing_mode", "message_timeout", "grpc_service"}
	for _, c := range []struct{ in, want string }{
		{"procesing_mode", "processing_mode"},
		{"processingMode", "processing_mode"},
		{"MESSAGE_TIMEOUT", "message_timeout"},
		{"grpc", ""},
		{"something_else", ""},
	} {
		if got := Suggest(c.in, names); got != c.want {
			t.Errorf("Suggest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// One path syntax for config and Envoy problems: profile names with dots are quoted too.
func TestConfigPaths(t *testing.T) {
	p := Fields(Key(Key("", "profiles"), "llama-3.1-8b"), "prefill.base_s")
	if p != `profiles["llama-3.1-8b"].prefill.base_s` {
		t.Fatalf("got %s", p)
	}
	if got := Index(Key("", "engines"), 2) + ".address"; got != "engines[2].address" {
		t.Fatalf("got %s", got)
	}
	l := List{{Path: "a.b", Msg: "bad"}, {Msg: "syntax"}}
	if l.Error() != "a.b: bad\nsyntax" {
		t.Fatalf("List.Error() = %q", l.Error())
	}
	if Suggest(string(make([]byte, 65)), []string{"x"}) != "" {
		t.Fatal("a 65-byte key got a suggestion")
	}
	if Suggest("ab", []string{"xy"}) != "" {
		t.Fatal("a rewrite of the whole key is not a typo")
	}
}

func TestLines(t *testing.T) {
	doc := "a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\nbase: &base {e: 3}\nm:\n  <<: *base\n  f: 4\n"
	idx := Lines([]byte(doc))
	for path, want := range map[string]int{"a": 1, "a.b": 2, "a.c[1]": 5, "a.c[1].d": 5, "m.f": 9, "m.e": 6} {
		if idx[path] != want {
			t.Errorf("line of %s = %d, want %d (%v)", path, idx[path], want, idx)
		}
	}
	if len(Lines([]byte("a: [\n"))) != 0 {
		t.Error("a document that does not parse gives lines")
	}
}
