package logbuf

import (
	"sync"
	"testing"
)

// Concurrent writers lose nothing, and a waiter on Changed wakes at the next write.
func TestBuffer(t *testing.T) {
	var b Buffer
	ch := b.Changed()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, _ = b.Write([]byte("x"))
			}
		})
	}
	<-ch
	wg.Wait()
	if n := len(b.String()); n != 800 || len(b.Bytes()) != 800 {
		t.Fatalf("wrote %d bytes, want 800", n)
	}
	ch = b.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before a write")
	default:
	}
	_, _ = b.Write([]byte("y"))
	<-ch
}
