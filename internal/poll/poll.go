// Package poll is the tests' one way to wait for what another goroutine or process will make
// true and offers no signal for: another process's HTTP state, a log, a file. It checks a
// condition every Interval until it holds or a limit passes. Where a channel or a Changed-style
// signal exists, wait on that instead.
package poll

import (
	"testing"
	"time"
)

// Interval is the time between two checks.
const Interval = 5 * time.Millisecond

// Within checks cond every Interval until it holds (true) or limit passes (false).
func Within(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(Interval)
	}
	return true
}

// Until is Within, failing the test when limit passes: "not within LIMIT: WHAT".
func Until(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(limit, cond) {
		t.Fatalf("not within %v: %s", limit, what)
	}
}
