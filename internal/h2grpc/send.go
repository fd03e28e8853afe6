package h2grpc

import (
	"runtime"
	"time"
)

// The send side of a connection.
//
// Frames are appended to out under wmu and written by whichever
// writer leaves with no other writer pending and no write in progress. It
// writes without holding wmu, and goes on writing what others appended
// meanwhile until out is empty; the others append and leave. So every frame
// is written, a write(2) carries all the answers that were ready, and no
// writer waits for another's system call. out is bounded: a writer finding it
// full waits for the write in progress, or writes itself.
//
// Before writing, the writer yields once (runtime.Gosched): answers whose
// goroutines are runnable get to append theirs first and leave in the same
// write. Under load that is most of them; alone, it costs a scheduler pass.

// lock takes the send side, waiting while out is full; release flushes if
// no other writer is pending.
func (c *conn) lock() {
	c.pending.Add(1)
	c.wmu.Lock()
	for len(c.out.b) >= maxOutBuffered && !c.closed {
		if !c.flushing {
			c.flush()
			continue
		}
		c.pending.Add(-1)
		c.wcond.Wait()
		c.pending.Add(1)
	}
}

func (c *conn) release() {
	if c.pending.Add(-1) == 0 {
		c.flush()
	}
	c.wmu.Unlock()
}

// flush writes out until it is empty, unless another writer is doing so;
// under wmu, which it lets go during each write. A client that does not
// read for the write timeout (10 s) loses its connection.
func (c *conn) flush() {
	if c.flushing {
		return
	}
	c.flushing = true
	// Answers that are about to be written (their goroutines runnable) join
	// this write if they get to run first.
	c.wmu.Unlock()
	runtime.Gosched()
	c.wmu.Lock()
	for len(c.out.b) > 0 && !c.closed {
		b := c.out.b
		c.out.b = c.spare[:0]
		c.wmu.Unlock()
		if testHookFlushing != nil {
			testHookFlushing()
		}
		c.nc.SetWriteDeadline(time.Now().Add(orDefault(c.s.writeTimeout, defaultWriteTimeout)))
		_, err := c.nc.Write(b)
		c.wmu.Lock()
		if cap(b) <= maxSpare {
			c.spare = b
		} else {
			c.spare = nil
		}
		if err != nil {
			c.closed = true
			c.nc.Close()
		}
		c.wcond.Broadcast() // room in out
	}
	c.flushing = false
	c.wcond.Broadcast() // written: for goAwayThenClose
}

// testHookFlushing, set by tests, runs while a flush writes without wmu.
var testHookFlushing func()

// outBuffer collects the framer's writes.
type outBuffer struct{ b []byte }

func (o *outBuffer) Write(p []byte) (int, error) {
	o.b = append(o.b, p...)
	return len(p), nil
}
