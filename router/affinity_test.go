package router

import (
	"slices"
	"testing"
)

// An engine's slot that goes to a newcomer takes none of its prefixes: forget drops it from
// every block's holders and keeps the others, most recent first; grow gives the newcomer room.
func TestAffinityForget(t *testing.T) {
	a := newAffinity(16, 64, 2)
	a.record([]uint64{1, 2}, 0)
	a.record([]uint64{1}, 1)
	a.record([]uint64{3}, 0)
	a.grow(3)
	a.record([]uint64{1, 2}, 2)
	a.forget(0)
	if got := a.match([]uint64{1, 2}); !slices.Equal(got, []int16{2, 1}) || a.cachedTokens(2) != 128 || a.cachedTokens(1) != 64 || a.cachedTokens(0) != 0 {
		t.Fatalf("after forget(0): touched %v, cached %d/%d/%d", got, a.cachedTokens(0), a.cachedTokens(1), a.cachedTokens(2))
	}
	a.reset()
	if _, ok := a.lru.Peek(3); ok {
		t.Fatal("a block only engine 0 held is still indexed")
	}
	var nilAff *affinity
	nilAff.grow(4)
	nilAff.forget(1)
}
