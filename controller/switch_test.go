package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/narwhal-llm/narwhal/fleet"
)

// SGLangSwitch reads SGLang's answers: a success, a refusal (success false), a failed rebuild
// (500), a server without the endpoint, and an answer naming another role.
func TestSGLangSwitch(t *testing.T) {
	for _, c := range []struct {
		status int
		body   string
		want   string // "" for a success
	}{
		{200, `{"success": true, "message": "ok", "old_role": "decode", "new_role": "prefill"}`, ""},
		{400, `{"success": false, "message": "the engine is not idle"}`, "refused (400 Bad Request): the engine is not idle"},
		{500, `{"success": false, "message": "rebuild failed"}`, "refused (500 Internal Server Error): rebuild failed"},
		{404, `<html>not found</html>`, "answered 404 Not Found: <html>not found</html>"},
		{200, `{"success": true, "message": "ok", "old_role": "decode", "new_role": "decode"}`, "the engine says it is now decode, not prefill"},
	} {
		var got string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b := make([]byte, 100)
			n, _ := r.Body.Read(b)
			got = r.Method + " " + r.URL.Path + " " + string(b[:n])
			w.WriteHeader(c.status)
			_, _ = w.Write([]byte(c.body))
		}))
		msg, err := SGLangSwitch{}.Switch(context.Background(), strings.TrimPrefix(srv.URL, "http://"), fleet.Prefill)
		srv.Close()
		if got != `POST /pd_role_switch {"new_role":"prefill"}` {
			t.Errorf("the request: %q", got)
		}
		switch {
		case c.want == "" && (err != nil || msg != "decode -> prefill: ok"):
			t.Errorf("%s: %q %v", c.body, msg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}
