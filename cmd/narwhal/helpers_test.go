package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/logbuf"
)

// logged waits (10 s at most) for a log line with msg and returns the values of keys in it
// (slog's text format, key=value).
func logged(t testing.TB, s *logbuf.Buffer, msg string, keys ...string) []string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		ch := s.Changed() // before reading: a write after it closes ch
		for _, line := range strings.Split(s.String(), "\n") {
			if !strings.Contains(line, "msg="+strconv.Quote(msg)) && !strings.Contains(line, "msg="+msg+" ") {
				continue
			}
			vals := make([]string, len(keys))
			for i, k := range keys {
				m := regexp.MustCompile(`(?:^| )` + regexp.QuoteMeta(k) + `=(\S+)`).FindStringSubmatch(line)
				if m == nil {
					t.Fatalf("log line %q has no %s", line, k)
				}
				vals[i] = m[1]
			}
			return vals
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("no %q log line within 10 s:\n%s", msg, s.String())
		}
	}
}

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

func httpPost(url string) (int, error) {
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}
