package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for a process's stdout and stderr writers and a reader,
// which can wait for what is written (changed).
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{} // closed at the next write; nil while no one waits
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote != nil {
		close(s.wrote)
		s.wrote = nil
	}
	return s.b.Write(p)
}

// changed returns a channel closed at the next write.
func (s *syncBuffer) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wrote == nil {
		s.wrote = make(chan struct{})
	}
	return s.wrote
}

// logged waits (10 s at most) for a log line with msg and returns the values of keys in it
// (slog's text format, key=value).
func (s *syncBuffer) logged(t testing.TB, msg string, keys ...string) []string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		ch := s.changed() // before reading: a write after it closes ch
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

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
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
