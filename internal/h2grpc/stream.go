package h2grpc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// A StreamMethod serves a streaming call: client, server or bidirectional
// streaming, as the method reads and writes. It runs from the call's
// HEADERS until it returns; its error, or OK, ends the call.
//
// What a streaming call may hold is bounded as a unary call's is: its
// request bytes by the stream's flow-control window, credited back only as
// the method takes messages (so a method that does not read stops its
// client, and what waits for it counts in the connection window), and its
// answer by one message waiting for the client's window (Send returns when
// it is out), counted in MaxHeldAnswerBytes and in the watcher's
// RequestTimeout for an answer the client does not read. A streaming call
// counts against MaxConcurrentStreams while it runs, and is not a request
// left incomplete: RequestTimeout does not end it. A drained connection
// (MaxConnectionAge, Shutdown) ends its streaming calls with UNAVAILABLE
// once its second GOAWAY is sent, so the client opens them again elsewhere.
type StreamMethod func(ctx context.Context, s *Stream) error

// Stream is a streaming call's two directions, for its method.
type Stream struct {
	c  *conn
	st *stream
}

// bidi is a streaming call's state beside its stream's.
type bidi struct {
	mu      sync.Mutex
	in      []byte // request bytes received; those before off are taken
	off     int
	ended   bool  // the client's END_STREAM
	gone    bool  // the call is over: nothing more is held
	held    int64 // bytes of in, inside the connection window
	granted int64 // stream window granted to the client so far
	recvd   int64 // stream bytes received

	wake    chan struct{} // in grew, or the request ended
	out     chan struct{} // a message Send left pending is out
	headers bool          // under wmu: the answer's HEADERS are sent
	drained atomic.Bool   // ended by the connection's drain
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// startStream runs a streaming call's method from its HEADERS.
func (c *conn) startStream(st *stream, m StreamMethod, ended bool) {
	st.bidi = &bidi{granted: c.streamWindow, ended: ended, wake: make(chan struct{}, 1), out: make(chan struct{}, 1)}
	if ended {
		st.ended.Store(true)
	}
	st.started = true
	c.running.Add(1)
	c.s.openCalls.Add(-1) // counted as a stream instead (finish)
	c.s.openStreams.Add(1)
	go c.runStream(st, m)
}

// onStreamData takes a DATA frame of a streaming call: the reader's.
func (c *conn) onStreamData(st *stream, f *http2.DataFrame) error {
	b, data := st.bidi, f.Data()
	pad := int64(f.Length) - int64(len(data))
	b.mu.Lock()
	if b.gone {
		b.mu.Unlock()
		c.creditConn(int64(f.Length))
		return nil
	}
	b.recvd += int64(f.Length)
	if b.recvd > b.granted {
		b.mu.Unlock()
		c.creditConn(int64(f.Length))
		return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeFlowControl}
	}
	if c.s.unfinishedBytes.Load()+int64(len(data)) > c.s.maxUnfinishedBytes() {
		b.mu.Unlock()
		c.creditConn(int64(f.Length))
		return http2.StreamError{StreamID: st.id, Code: http2.ErrCodeEnhanceYourCalm}
	}
	b.in = append(b.in, data...)
	b.held += int64(len(data))
	c.s.unfinishedBytes.Add(int64(len(data)))
	if f.StreamEnded() {
		b.ended = true
		st.ended.Store(true)
	}
	b.mu.Unlock()
	if pad > 0 {
		c.creditConn(pad)
	}
	signal(b.wake)
	return nil
}

// release ends what the call holds and returns the bytes to credit back.
func (b *bidi) release(s *Server) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.held
	s.unfinishedBytes.Add(-n)
	b.gone, b.in, b.off, b.held = true, nil, 0, 0
	return n
}

// sent tells a waiting Send that its message is out; under wmu.
func (b *bidi) sent() { signal(b.out) }

// Recv returns the call's next request message, a copy the caller keeps;
// io.EOF once the client has ended its side. It waits for a message, and
// returns the call's context error when the call ends first.
func (s *Stream) Recv() ([]byte, error) {
	c, st, b := s.c, s.st, s.st.bidi
	for {
		b.mu.Lock()
		msg, n, bad := nextMessage(b.in[b.off:], c.maxRecv)
		if bad != nil {
			b.mu.Unlock()
			return nil, grpcstatus.Error(bad.code, bad.message)
		}
		if n > 0 {
			msg = append([]byte(nil), msg...)
			// Taken from the front; the rest moves down only once the
			// taken part is most of the buffer, so that many small
			// messages do not each copy all that follows them.
			if b.off += n; b.off >= len(b.in)/2 {
				b.in, b.off = append(b.in[:0], b.in[b.off:]...), 0
			}
			b.held -= int64(n)
			c.s.unfinishedBytes.Add(-int64(n))
			ended := b.ended
			if !ended {
				b.granted += int64(n)
			}
			b.mu.Unlock()
			c.creditConn(int64(n))
			if !ended {
				c.lock()
				if !c.closed {
					c.fr.WriteWindowUpdate(st.id, uint32(n))
				}
				c.release()
			}
			return msg, nil
		}
		ended, rest := b.ended, len(b.in)-b.off
		b.mu.Unlock()
		if ended {
			if rest > 0 {
				return nil, grpcstatus.Error(codes.Internal, "the request's last message is cut short")
			}
			return nil, io.EOF
		}
		select {
		case <-b.wake:
		case <-st.ctx.Done():
			return nil, st.ctx.Err()
		}
	}
}

// nextMessage finds the first length-prefixed message of in: the message,
// the bytes it takes (0: not all here yet), or why it cannot be taken.
func nextMessage(in []byte, maxRecv int) ([]byte, int, *status) {
	if len(in) < 5 {
		return nil, 0, nil
	}
	n := binary.BigEndian.Uint32(in[1:5])
	switch {
	case in[0] == 1:
		return nil, 0, &status{code: codes.Unimplemented, message: "compressed request messages are not supported"}
	case in[0] != 0:
		return nil, 0, &status{code: codes.Internal, message: "invalid message flags"}
	case uint64(n) > uint64(maxRecv):
		return nil, 0, &status{code: codes.ResourceExhausted, message: "request message larger than " + strconv.Itoa(maxRecv) + " bytes"}
	case uint64(len(in)-5) < uint64(n):
		return nil, 0, nil
	}
	return in[5 : 5+n], 5 + int(n), nil
}

// Send sends an answer message. It returns once the message is written
// or waiting only for the connection's writer; while the client has no
// window for it, it waits, and returns an error if the call ends first or
// if the answers held for clients are at MaxHeldAnswerBytes.
func (s *Stream) Send(msg []byte) error {
	c, st, b := s.c, s.st, s.st.bidi
	framed := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(framed[1:5], uint32(len(msg)))
	copy(framed[5:], msg)
	c.lock()
	if c.closed || st.reset || st.finished {
		c.release()
		return grpcstatus.Error(codes.Canceled, "the call has ended")
	}
	if held := int64(len(framed)) - max(0, c.window(st)); held > 0 && c.s.heldAnswerBytes.Load()+held > c.s.maxHeldAnswerBytes() {
		c.release()
		return grpcstatus.Error(errHeldAnswers.code, errHeldAnswers.message)
	}
	if !b.headers {
		c.writeHeaders(st.id, false, okHeaders)
		b.headers = true
	}
	c.lastAnswer.Store(time.Now().UnixNano())
	c.answered.Add(1) // the client's WINDOW_UPDATEs for it are not a flood
	rest := c.writeData(st, framed)
	if len(rest) == 0 {
		c.release()
		return nil
	}
	st.pending = rest
	c.s.heldAnswerBytes.Add(int64(len(rest)))
	st.heldSince = time.Now()
	c.blocked = append(c.blocked, st)
	c.release()
	select {
	case <-b.out:
		return nil
	case <-st.ctx.Done():
		return st.ctx.Err()
	}
}

// runStream runs a streaming call's method and ends the call with its
// status: trailers after the answer's messages, or trailers alone.
func (c *conn) runStream(st *stream, m StreamMethod) {
	err := c.callStream(st, m)
	st.cancel()
	b := st.bidi
	c.lock()
	if st.pending != nil {
		c.unblock(st)
	}
	if !c.closed && !st.reset {
		bad := streamStatus(err, b.drained.Load())
		switch {
		case !b.headers && bad == nil:
			c.writeHeaders(st.id, true, append(okHeaders[:len(okHeaders):len(okHeaders)], okTrailers...))
		case !b.headers:
			c.writeHeaders(st.id, true, trailersOnly(bad))
		case bad == nil:
			c.writeHeaders(st.id, true, okTrailers)
		default:
			c.writeHeaders(st.id, true, []hpack.HeaderField{
				{Name: "grpc-status", Value: strconv.Itoa(int(bad.code))},
				{Name: "grpc-message", Value: encodeMessage(bad.message)},
			})
		}
		if !st.ended.Load() {
			c.fr.WriteRSTStream(st.id, http2.ErrCodeNo) // the client need send no more
		}
	}
	c.finish(st)
	c.release()
	c.creditConn(b.release(c.s))
	c.running.Add(-1)
}

// callStream calls the method inside the panic boundary.
func (c *conn) callStream(st *stream, m StreamMethod) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if c.s.OnPanic != nil {
				c.s.OnPanic(st.path, v)
			}
			err = grpcstatus.Error(codes.Internal, "the server could not answer this call")
		}
	}()
	return m(st.ctx, &Stream{c: c, st: st})
}

// streamStatus is a streaming call's end: nil for OK.
func streamStatus(err error, drained bool) *status {
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return nil
	case drained && errors.Is(err, context.Canceled):
		return &status{code: codes.Unavailable, message: "the server is closing this connection: open the call again"}
	case errors.Is(err, context.DeadlineExceeded):
		return &status{code: codes.DeadlineExceeded, message: err.Error()}
	case errors.Is(err, context.Canceled):
		return &status{code: codes.Canceled, message: err.Error()}
	}
	s := grpcstatus.Convert(err)
	if s.Code() == codes.OK {
		return nil
	}
	return &status{code: s.Code(), message: s.Message()}
}

// endStreams ends the streaming calls of a drained connection; under wmu.
func (c *conn) endStreams() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.streams {
		if st.bidi != nil {
			st.bidi.drained.Store(true)
			st.cancel()
		}
	}
}
