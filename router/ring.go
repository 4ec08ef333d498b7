package router

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
// pricing class by their load.
type minHeap struct{ items []heapItem }

type heapItem struct {
	key float64
	id  uint64
}

func (d *minHeap) len() int { return len(d.items) }

func (d *minHeap) reset() { d.items = d.items[:0] }

func (d *minHeap) push(key float64, id uint64) {
	d.items = append(d.items, heapItem{key, id})
	for i := len(d.items) - 1; i > 0; {
		p := (i - 1) / 2
		if d.items[p].key <= d.items[i].key {
			break
		}
		d.items[p], d.items[i] = d.items[i], d.items[p]
		i = p
	}
}

func (d *minHeap) peek() heapItem { return d.items[0] }

func (d *minHeap) pop() {
	n := len(d.items) - 1
	d.items[0] = d.items[n]
	d.items = d.items[:n]
	d.down(0)
}

// fix sets the top's key and restores the order.
func (d *minHeap) fix(key float64) {
	d.items[0].key = key
	d.down(0)
}

func (d *minHeap) down(i int) {
	n := len(d.items)
	for {
		l, s := 2*i+1, i
		if l < n && d.items[l].key < d.items[s].key {
			s = l
		}
		if r := l + 1; r < n && d.items[r].key < d.items[s].key {
			s = r
		}
		if s == i {
			return
		}
		d.items[i], d.items[s] = d.items[s], d.items[i]
		i = s
	}
}
