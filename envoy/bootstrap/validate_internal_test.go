package bootstrap

import "testing"

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
