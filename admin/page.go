package admin

import (
	_ "embed"
	"net/http"
)

// page is the live page (page/index.html): one self-contained HTML document that reads
// /narwhal/state and /narwhal/history (docs/history.md).
//
//go:embed page/index.html
var page []byte

// servePage serves the live page at /. It needs no token: it reads only what the GET endpoints
// show.
func (s *Server) servePage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	_, _ = w.Write(page)
}
