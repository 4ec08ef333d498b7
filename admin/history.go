package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/narwhal-llm/narwhal/decisionlog"
	"github.com/narwhal-llm/narwhal/history"
)

// history serves GET /narwhal/history?since=T: the samples and decision records after T (RFC
// 3339, or seconds since the Unix epoch; everything kept without it). It needs no token: it shows
// what /narwhal/state shows, over time.
func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	if s.o.History == nil {
		writeError(w, http.StatusNotFound, "not_found", "this process keeps no history")
		return
	}
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			f, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil {
				writeError(w, http.StatusBadRequest, "invalid_request", "since: want an RFC 3339 time or Unix seconds, got "+strconv.Quote(v))
				return
			}
			t = time.Unix(0, int64(f*1e9))
		}
		since = t
	}
	samples, decisions := s.o.History.Since(since)
	_, _, sc, dc := s.o.History.Len()
	h := s.o.Config.Admin.History
	writeJSON(w, http.StatusOK, history.Document[decisionlog.Decision]{Epoch: s.o.Start, IntervalS: h.IntervalS,
		Capacity: history.Capacity{Samples: sc, Decisions: dc}, Advisory: s.o.Config.Controller.Advisory, SLO: s.o.Config.SLO,
		Samples: nonNil(samples), Decisions: nonNil(decisions)})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
