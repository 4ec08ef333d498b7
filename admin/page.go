package admin

import (
	"net/http"

	"github.com/narwhal-llm/narwhal/page"
)

// servePage serves the live page (package page) at /. It needs no token: it reads only what the
// GET endpoints show.
func (s *Server) servePage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	_, _ = w.Write(page.HTML)
}
