package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/narwhal-llm/narwhal/internal/poll"
)

func TestRunPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), ln.Addr().String(), Options{Profile: fastProfile()}) }()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), ln.Addr().String()) {
			t.Errorf("Run on a busy port: %v, want a wrapped EADDRINUSE naming the address", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run on a busy port did not return")
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, Options{Profile: fastProfile(), Role: "prefill"}) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Second}
	var health struct{ Status, Role string }
	poll.Until(t, 5*time.Second, "the engine to answer /health", func() bool {
		resp, err := client.Get("http://" + addr + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&health) == nil && resp.StatusCode == http.StatusOK
	})
	if health.Role != "prefill" {
		t.Errorf("health %+v", health)
	}
	resp, err := client.Post("http://"+addr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"x","max_tokens":2}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %v %v", resp, err)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
