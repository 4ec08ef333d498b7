package router

import "iter"

// ring is a growable FIFO of handles. Removal from the middle is lazy: readers skip handles
// whose request has left the phase the ring tracks.
type ring struct {
	buf        []Handle
	head, size int
}

func (q *ring) len() int { return q.size }

func (q *ring) push(h Handle) {
	if q.size == len(q.buf) {
		grown := make([]Handle, max(16, 2*len(q.buf)))
		for i := 0; i < q.size; i++ {
			grown[i] = q.at(i)
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = h
	q.size++
}

func (q *ring) at(i int) Handle { return q.buf[(q.head+i)%len(q.buf)] }

// all iterates the handles in FIFO order.
func (q *ring) all() iter.Seq[Handle] {
	return func(yield func(Handle) bool) {
		first := min(q.size, len(q.buf)-q.head)
		for _, h := range q.buf[q.head : q.head+first] {
			if !yield(h) {
				return
			}
		}
		for _, h := range q.buf[:q.size-first] {
			if !yield(h) {
				return
			}
		}
	}
}

func (q *ring) peek() (Handle, bool) {
	if q.size == 0 {
		return 0, false
	}
	return q.buf[q.head], true
}

func (q *ring) pop() {
	q.buf[q.head] = 0
	q.head = (q.head + 1) % len(q.buf)
	q.size--
}

// minHeap is a binary min-heap of ids by key, without allocation once grown: deadlines of
// handles that do not come in dispatch order (removal lazy, as in ring), and the engines of a
// pricing class by their load. Keys and ids are kept apart so that sifting, which compares
// keys only, touches half the memory.
type minHeap struct {
	keys []float64
	ids  []uint64
}

type heapItem struct {
	key float64
	id  uint64
}

func (d *minHeap) len() int { return len(d.keys) }

func (d *minHeap) reset() { d.keys, d.ids = d.keys[:0], d.ids[:0] }

func (d *minHeap) push(key float64, id uint64) {
	d.keys, d.ids = append(d.keys, key), append(d.ids, id)
	d.up(len(d.keys)-1, key, id)
}

func (d *minHeap) peek() heapItem { return heapItem{d.keys[0], d.ids[0]} }

// top is the smallest key.
func (d *minHeap) top() float64 { return d.keys[0] }

func (d *minHeap) pop() {
	n := len(d.keys) - 1
	key, id := d.keys[n], d.ids[n]
	d.keys, d.ids = d.keys[:n], d.ids[:n]
	if n > 0 {
		d.replaceTop(key, id)
	}
}

// fix sets the top's key and restores the order.
func (d *minHeap) fix(key float64) { d.replaceTop(key, d.ids[0]) }

// replaceTop puts (key, id) in the top's place. Bottom-up: the hole at the top follows the
// smaller children down to a leaf, then the item rises from there. A raised top (pricing adds
// a request's work to the engine free first) usually belongs near the bottom, so this makes
// one comparison a level instead of two.
func (d *minHeap) replaceTop(key float64, id uint64) {
	k, ids := d.keys, d.ids
	i, n := 0, len(k)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && k[r] < k[c] {
			c = r
		}
		k[i], ids[i] = k[c], ids[c]
		i = c
	}
	d.up(i, key, id)
}

// up places (key, id) at the hole i or above it.
func (d *minHeap) up(i int, key float64, id uint64) {
	k, ids := d.keys, d.ids
	for i > 0 {
		p := (i - 1) / 2
		if k[p] <= key {
			break
		}
		k[i], ids[i] = k[p], ids[p]
		i = p
	}
	k[i], ids[i] = key, id
}
