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
