package router

import (
	"slices"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// holders are the engines that recently prefilled one prefix block, newest first.
type holders struct {
	n       uint8
	engines [4]int16
}

func (h *holders) add(e int16) {
	for i := 0; i < int(h.n); i++ {
		if h.engines[i] == e {
			copy(h.engines[1:i+1], h.engines[:i])
			h.engines[0] = e
			return
		}
	}
	if h.n < uint8(len(h.engines)) {
		h.n++
	}
	copy(h.engines[1:h.n], h.engines[:h.n-1])
	h.engines[0] = e
}

// affinity is the prefix-affinity index: prompt-prefix block hash → the engines that recently
// prefilled it (least recently used blocks are evicted). Hashes are chained, so block i's hash
// stands for the whole prefix up to block i.
type affinity struct {
	lru   *simplelru.LRU[uint64, holders]
	size  int // the LRU's size
	block int // tokens per block
	// matched[e] is scratch for match: the number of leading blocks engine e holds.
	matched []int32
	touched []int16
}

func newAffinity(entries, blockTokens, engines int) *affinity {
	if entries <= 0 || blockTokens <= 0 {
		return nil
	}
	lru, err := simplelru.NewLRU[uint64, holders](entries, nil)
	if err != nil {
		return nil
	}
	return &affinity{lru: lru, size: entries, block: blockTokens, matched: make([]int32, engines)}
}

// clone copies the index, its blocks in the same recency order (nil stays nil).
func (a *affinity) clone() *affinity {
	if a == nil {
		return nil
	}
	n := &affinity{size: a.size, block: a.block, matched: make([]int32, len(a.matched))}
	n.lru, _ = simplelru.NewLRU[uint64, holders](a.size, nil)
	keys, values := a.lru.Keys(), a.lru.Values() // oldest first
	for i, k := range keys {
		n.lru.Add(k, values[i])
	}
	return n
}

// match fills a.matched with each engine's cached leading blocks of prefix and returns the
// engines touched; call reset after use.
func (a *affinity) match(prefix []uint64) []int16 {
	for i, h := range prefix {
		hs, ok := a.lru.Peek(h)
		if !ok {
			break
		}
		progressed := false
		for j := 0; j < int(hs.n); j++ {
			e := hs.engines[j]
			if a.matched[e] == int32(i) {
				if i == 0 {
					a.touched = append(a.touched, e)
				}
				a.matched[e] = int32(i + 1)
				progressed = true
			}
		}
		if !progressed {
			break
		}
	}
	return a.touched
}

func (a *affinity) reset() {
	for _, e := range a.touched {
		a.matched[e] = 0
	}
	a.touched = a.touched[:0]
}

// cachedTokens is the prompt tokens engine e holds of the last matched prefix.
func (a *affinity) cachedTokens(e int) int { return int(a.matched[e]) * a.block }

// record notes that engine e prefilled prefix.
func (a *affinity) record(prefix []uint64, e int16) {
	for _, h := range prefix {
		hs, ok := a.lru.Get(h) // Get marks the block recently used
		if ok && hs.n > 0 && hs.engines[0] == e {
			continue
		}
		hs.add(e)
		a.lru.Add(h, hs)
	}
}

// grow makes room for engines engines (one joined the fleet).
func (a *affinity) grow(engines int) {
	if a != nil && len(a.matched) < engines {
		a.matched = append(a.matched, make([]int32, engines-len(a.matched))...)
	}
}

// forget drops engine e from every block's holders (its slot goes to an engine that joined).
func (a *affinity) forget(e int16) {
	if a == nil {
		return
	}
	for _, k := range a.lru.Keys() {
		hs, _ := a.lru.Peek(k)
		j := slices.Index(hs.engines[:hs.n], e)
		if j < 0 {
			continue
		}
		copy(hs.engines[j:hs.n], hs.engines[j+1:hs.n])
		hs.n--
		if hs.n == 0 {
			a.lru.Remove(k)
		} else {
			a.lru.Add(k, hs) // Add on a present key updates it in place (its recency too)
		}
	}
}
