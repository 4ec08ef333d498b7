package enginesim

import "github.com/hashicorp/golang-lru/v2/simplelru"

// prefixCache is an engine's prefix cache in the virtual-time Model: the prompt-prefix blocks it
// prefilled recently (least recently used evicted), each blockTokens tokens. A prompt whose
// leading blocks are cached prefills only the rest: the router prices a cached prefix the same
// way (the prefill curve at the uncached tokens).
type prefixCache struct {
	lru          *simplelru.LRU[uint64, struct{}]
	blocks       int // the LRU's size
	blockTokens  int
	hitTokens    uint64 // prompt tokens served from the cache
	promptTokens uint64 // prompt tokens prefilled, cached or not
}

func newPrefixCache(blocks, blockTokens int) *prefixCache {
	if blocks <= 0 || blockTokens <= 0 {
		return nil
	}
	lru, err := simplelru.NewLRU[uint64, struct{}](blocks, nil)
	if err != nil {
		return nil
	}
	return &prefixCache{lru: lru, blocks: blocks, blockTokens: blockTokens}
}

// clone copies the cache, its blocks in the same recency order (nil stays nil).
func (c *prefixCache) clone() *prefixCache {
	if c == nil {
		return nil
	}
	n := *c
	n.lru, _ = simplelru.NewLRU[uint64, struct{}](c.blocks, nil)
	for _, h := range c.lru.Keys() { // oldest first
		n.lru.Add(h, struct{}{})
	}
	return &n
}

// hit returns the tokens of prompt whose prefix blocks are cached (at most prompt-1: the last
// token is always computed), and caches the prompt's blocks, as prefilling it does. A nil cache
// hits nothing.
func (c *prefixCache) hit(prefix []uint64, prompt int) int {
	if c == nil {
		return 0
	}
	n := 0
	for _, h := range prefix {
		if _, ok := c.lru.Get(h); !ok {
			break
		}
		n++
	}
	for _, h := range prefix[n:] {
		c.lru.Add(h, struct{}{})
	}
	cached := min(n*c.blockTokens, max(prompt-1, 0))
	c.hitTokens += uint64(cached)
	c.promptTokens += uint64(prompt)
	return cached
}
