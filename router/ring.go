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

// deadlines is a min-heap of handles by time, for deadlines that do not come in dispatch order.
// Removal is lazy, as in ring.
type deadlines struct{ items []deadline }

type deadline struct {
	at float64
	h  Handle
}

func (d *deadlines) len() int { return len(d.items) }

func (d *deadlines) push(at float64, h Handle) {
	d.items = append(d.items, deadline{at, h})
	for i := len(d.items) - 1; i > 0; {
		p := (i - 1) / 2
		if d.items[p].at <= d.items[i].at {
			break
		}
		d.items[p], d.items[i] = d.items[i], d.items[p]
		i = p
	}
}

func (d *deadlines) peek() deadline { return d.items[0] }

func (d *deadlines) pop() {
	n := len(d.items) - 1
	d.items[0] = d.items[n]
	d.items = d.items[:n]
	for i := 0; ; {
		l, s := 2*i+1, i
		if l < n && d.items[l].at < d.items[s].at {
			s = l
		}
		if r := l + 1; r < n && d.items[r].at < d.items[s].at {
			s = r
		}
		if s == i {
			return
		}
		d.items[i], d.items[s] = d.items[s], d.items[i]
		i = s
	}
}
