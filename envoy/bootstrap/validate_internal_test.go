package bootstrap

import "testing"

func TestValidatePathHelpers(t *testing.T) {
	for _, c := range []struct{ path, key, want string }{
		{"", "static_resources", "static_resources"},
		{"a", "b_c", "a.b_c"},
		{"a", "@type", "a.@type"},
		{"a", "narwhal-extproc", "a.narwhal-extproc"},
		{"a", "envoy.lb", `a["envoy.lb"]`},
		{"a", `we"ird]`, `a["we\"ird]"]`},
	} {
		if got := pathKey(c.path, c.key); got != c.want {
			t.Errorf("pathKey(%q, %q) = %q, want %q", c.path, c.key, got, c.want)
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
		if got := pathParent(c.path); got != c.want {
			t.Errorf("pathParent(%q) = %q, want %q", c.path, got, c.want)
		}
	}
}

func TestValidateJSONPathAt(t *testing.T) {
	js := []byte(`{"a":{"b":[1,{"c":"x"}],"d.e":true},"f":null}`)
	for _, c := range []struct {
		at   string // the text at the offset
		want string
	}{
		{`"a"`, "a"},
		{`{"b"`, "a"},
		{`"b"`, "a.b"},
		{`[1`, "a.b"},
		{`1,`, "a.b[0]"},
		{`"c"`, "a.b[1].c"},
		{`"x"`, "a.b[1].c"},
		{`"d.e"`, `a["d.e"]`},
		{`true`, `a["d.e"]`},
		{`null`, "f"},
	} {
		off := -1
		for i := range js {
			if string(js[i:min(len(js), i+len(c.at))]) == c.at {
				off = i
				break
			}
		}
		if off < 0 {
			t.Fatalf("%q not in the document", c.at)
		}
		if got := jsonPathAt(js, off); got != c.want {
			t.Errorf("jsonPathAt(%q) = %q, want %q", c.at, got, c.want)
		}
	}
}

func TestValidateSuggest(t *testing.T) {
	names := []string{"processing_mode", "message_timeout", "grpc_service"}
	for _, c := range []struct{ in, want string }{
		{"procesing_mode", "processing_mode"},
		{"processingMode", "processing_mode"},
		{"MESSAGE_TIMEOUT", "message_timeout"},
		{"grpc", ""},
		{"something_else", ""},
	} {
		if got := suggest(c.in, names); got != c.want {
			t.Errorf("suggest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
