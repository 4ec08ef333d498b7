package gateway

import (
	"io"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// inbox queues what the stream's receive goroutine reads, so that the
// exchange can wait for a reply, a timer and downstream data at once (Envoy
// reads its side stream on the event loop, never blocking the server's
// sends).
type inbox struct {
	mu     sync.Mutex
	queue  []*extprocv3.ProcessingResponse
	ended  bool
	err    error         // why Recv stopped; io.EOF for an OK end
	signal chan struct{} // capacity 1: something was queued
	exited chan struct{} // closed when the receive goroutine returns
}

func newInbox() *inbox {
	return &inbox{signal: make(chan struct{}, 1), exited: make(chan struct{})}
}

// receive runs Recv until the stream ends.
func (in *inbox) receive(stream extprocv3.ExternalProcessor_ProcessClient) {
	defer close(in.exited)
	for {
		r, err := stream.Recv()
		in.mu.Lock()
		if err != nil {
			in.ended, in.err = true, err
		} else {
			in.queue = append(in.queue, r)
		}
		in.mu.Unlock()
		select {
		case in.signal <- struct{}{}:
		default:
		}
		if err != nil {
			return
		}
	}
}

// next returns the oldest queued reply, else the end of the stream, else
// nothing.
func (in *inbox) next() (r *extprocv3.ProcessingResponse, ended bool, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.queue) > 0 {
		r = in.queue[0]
		in.queue[0] = nil
		in.queue = in.queue[1:]
		return r, false, nil
	}
	return nil, in.ended, in.err
}

// bodyChunk is one piece of a body as the codec delivers it.
type bodyChunk struct {
	data []byte
	eos  bool  // the body ends with this chunk
	err  error // the body could not be read (downstream or upstream reset)
}

// chunkSize is the largest chunk read at once.
const chunkSize = 32 << 10

// chunker turns a body reader into chunks: each Read is one chunk, as each
// codec read is one decodeData call in Envoy. io.EOF returned together with
// data ends the body on that chunk (Go's readers do so for content-length
// bodies); io.EOF alone ends it with an empty chunk (as a chunked body's
// terminator does).
type chunker struct {
	r       io.Reader
	buf     *[]byte
	err     error // a read error seen after data, returned next
	started bool  // start handed the chunker to a goroutine
}

// readBuffers recycles the chunkers' read buffers.
var readBuffers = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

func newChunker(r io.Reader) *chunker {
	if r == nil {
		return nil
	}
	return &chunker{r: r, buf: readBuffers.Get().(*[]byte)}
}

// release recycles the read buffer, unless a goroutine owns the chunker.
func (c *chunker) release() {
	if c == nil || c.started || c.buf == nil {
		return
	}
	readBuffers.Put(c.buf)
	c.buf = nil
}

func (c *chunker) next() bodyChunk {
	if c.err != nil {
		return bodyChunk{err: c.err}
	}
	for {
		n, err := c.r.Read(*c.buf)
		if n > 0 {
			data := append([]byte(nil), (*c.buf)[:n]...)
			switch {
			case err == io.EOF:
				return bodyChunk{data: data, eos: true}
			case err != nil:
				c.err = err
			}
			return bodyChunk{data: data}
		}
		if err == io.EOF {
			return bodyChunk{eos: true}
		}
		if err != nil {
			return bodyChunk{err: err}
		}
	}
}

// start reads chunks on a goroutine, for FULL_DUPLEX_STREAMED where chunks go
// out as they arrive while replies come back. stop abandons the goroutine;
// it returns once its pending Read returns (the owner of the reader unblocks
// it by closing the body or cancelling the request).
func (c *chunker) start() (chunks <-chan bodyChunk, stop func()) {
	ch := make(chan bodyChunk)
	done := make(chan struct{})
	c.started = true
	go func() {
		defer func() {
			readBuffers.Put(c.buf)
		}()
		for {
			b := c.next()
			select {
			case ch <- b:
			case <-done:
				return
			}
			if b.eos || b.err != nil {
				return
			}
		}
	}()
	var once sync.Once
	return ch, func() { once.Do(func() { close(done) }) }
}

// drain reads the rest of the body and hands it to sink.
func (c *chunker) drain(sink func([]byte) error) error {
	for {
		b := c.next()
		if b.err != nil {
			return b.err
		}
		if len(b.data) > 0 {
			if err := sink(b.data); err != nil {
				return err
			}
		}
		if b.eos {
			return nil
		}
	}
}

// since is time.Since, zero for a zero start.
func since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t)
}
