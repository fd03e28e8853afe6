package h2grpc

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
)

// The answer of a call is HEADERS (:status 200, content-type), one DATA
// with the length-prefixed message, and trailers (grpc-status 0); an error is
// the trailers alone, with the HTTP fields, grpc-status and grpc-message.
var (
	okHeaders  = []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}
	okTrailers = []hpack.HeaderField{{Name: "grpc-status", Value: "0"}}
)

// call runs the method, with the panic boundary. The method appends its
// message after 5 bytes kept for its prefix.
func (c *conn) call(st *stream, msg []byte, out []byte) (framed []byte, bad *status) {
	defer func() {
		if v := recover(); v != nil {
			if c.s.OnPanic != nil {
				c.s.OnPanic(st.path, v)
			}
			framed, bad = nil, &status{code: codes.Internal, message: "the server could not answer this call"}
		}
	}()
	out = append(out[:0], 0, 0, 0, 0, 0)
	body, err := st.method(st.ctx, msg, out[5:5])
	if err != nil {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return nil, &status{code: codes.DeadlineExceeded, message: err.Error()}
		case errors.Is(err, context.Canceled):
			return nil, &status{code: codes.Canceled, message: err.Error()}
		}
		s := grpcstatus.Convert(err)
		return nil, &status{code: s.Code(), message: s.Message()}
	}
	if len(body) > math.MaxUint32 {
		return nil, &status{code: codes.ResourceExhausted, message: "response message too large"}
	}
	// A body the method appended in place is copied onto itself (a
	// memmove of its bytes): one path whether or not it grew.
	framed = append(out[:5], body...)
	binary.BigEndian.PutUint32(framed[1:5], uint32(len(body)))
	return framed, nil
}

// answer sends a handler's answer, unless the stream was reset or the
// connection ended meanwhile. What the client has no window for stays on
// the stream, to be sent by the reader as the windows grow (sendPending):
// the handler's goroutine never waits for the client.
func (c *conn) answer(st *stream, framed []byte, bad *status) {
	c.lock()
	defer c.release()
	if c.closed || st.reset {
		c.finish(st)
		return
	}
	if bad != nil {
		c.writeHeaders(st.id, true, trailersOnly(bad))
		c.finish(st)
		return
	}
	// What the window does not take would be held; an answer it takes
	// whole adds nothing (held <= 0) and is never refused.
	if held := int64(len(framed)) - max(0, c.window(st)); c.s.heldAnswerBytes.Load()+held > c.s.maxHeldAnswerBytes() {
		c.writeHeaders(st.id, true, trailersOnly(errHeldAnswers))
		c.finish(st)
		return
	}
	c.writeHeaders(st.id, false, okHeaders)
	if rest := c.writeData(st, framed); len(rest) > 0 {
		st.pending = append(make([]byte, 0, len(rest)), rest...) // framed goes back to its pool
		c.s.heldAnswerBytes.Add(int64(len(rest)))
		st.heldSince = time.Now()
		c.blocked = append(c.blocked, st)
		return
	}
	c.writeHeaders(st.id, true, okTrailers)
	c.finish(st)
}

// finish ends a started stream's hold on MaxConcurrentStreams, once; under
// wmu. The client may open another stream as soon as it reads the answer,
// which is flushed only after this (release).
func (c *conn) finish(st *stream) {
	if st.finished {
		return
	}
	st.finished = true
	c.answered.Add(1)
	c.lastAnswer.Store(time.Now().UnixNano())
	c.mu.Lock()
	if c.streams[st.id] == st {
		delete(c.streams, st.id)
	}
	c.mu.Unlock()
	c.active.Add(-1)
	if st.bidi != nil {
		c.s.openStreams.Add(-1)
	} else {
		c.s.openCalls.Add(-1)
	}
}

// sendPending writes what a blocked answer's windows now allow, and its
// trailers once it is all sent; under wmu.
func (c *conn) sendPending(st *stream) {
	if c.closed {
		return
	}
	before := len(st.pending)
	st.pending = c.writeData(st, st.pending)
	c.s.heldAnswerBytes.Add(int64(len(st.pending) - before))
	if len(st.pending) > 0 {
		return
	}
	c.unblock(st)
	if st.bidi != nil {
		st.bidi.sent() // the message is out; the stream goes on
		return
	}
	c.writeHeaders(st.id, true, okTrailers)
	c.finish(st)
}

// drainBlocked sends the blocked answers, in order, as far as the
// connection's window goes; under wmu.
func (c *conn) drainBlocked() {
	for i := 0; i < len(c.blocked) && c.sendConn > 0; {
		st := c.blocked[i]
		c.sendPending(st)
		if st.pending != nil {
			i++ // still waiting for its own window
		}
	}
}

// unblock removes st from the blocked answers; under wmu.
func (c *conn) unblock(st *stream) {
	for i, b := range c.blocked {
		if b == st {
			c.blocked = slices.Delete(c.blocked, i, i+1) // zeroes the freed slot
			break
		}
	}
	c.s.heldAnswerBytes.Add(-int64(len(st.pending)))
	st.pending = nil
}

// errHeldAnswers answers a call whose answer the client has no window for
// while the answers held for such clients are at MaxHeldAnswerBytes.
var errHeldAnswers = &status{code: codes.ResourceExhausted, message: "too many answers are waiting for their clients to read them"}

// answerNow answers a call from the reader without running it; if the
// client is still sending, RST_STREAM(NO_ERROR) tells it to stop.
func (c *conn) answerNow(id uint32, bad *status, ended bool) {
	c.lock()
	defer c.release()
	if c.closed {
		return
	}
	if bad.http != "" { // not a gRPC call: an HTTP status
		c.writeHeaders(id, true, []hpack.HeaderField{{Name: ":status", Value: bad.http}})
	} else {
		c.writeHeaders(id, true, trailersOnly(bad))
	}
	if !ended {
		c.fr.WriteRSTStream(id, http2.ErrCodeNo)
	}
}

func trailersOnly(s *status) []hpack.HeaderField {
	return []hpack.HeaderField{
		{Name: ":status", Value: "200"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "grpc-status", Value: strconv.Itoa(int(s.code))},
		{Name: "grpc-message", Value: encodeMessage(s.message)},
	}
}

// writeHeaders encodes fields and writes them as HEADERS and, beyond the
// client's frame size, CONTINUATION frames; under wmu.
func (c *conn) writeHeaders(id uint32, end bool, fields []hpack.HeaderField) {
	c.hbuf.Reset()
	for _, f := range fields {
		c.henc.WriteField(f)
	}
	block := c.hbuf.Bytes()
	c.sentSincePing = true
	n := min(len(block), c.peerMaxFrame)
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:n], EndStream: end, EndHeaders: n == len(block)})
	for block = block[n:]; len(block) > 0; block = block[n:] {
		n = min(len(block), c.peerMaxFrame)
		c.fr.WriteContinuation(id, n == len(block), block[:n])
	}
}

// window is what st may send now: the least of the connection's and the
// stream's send windows; under wmu.
func (c *conn) window(st *stream) int64 {
	return min(c.sendConn, c.peerInitWindow+st.sendDelta)
}

// writeData writes b in DATA frames as far as the send windows allow and
// returns what they did not; under wmu.
func (c *conn) writeData(st *stream, b []byte) []byte {
	for len(b) > 0 {
		w := c.window(st)
		if w <= 0 {
			return b
		}
		n := min(int64(len(b)), w, int64(c.peerMaxFrame))
		c.fr.WriteData(st.id, false, b[:n])
		c.sentSincePing = true
		c.sendConn -= n
		st.sendDelta -= n
		b = b[n:]
	}
	return nil
}

// unframe reads the one message of a unary call from its DATA.
func unframe(b []byte, maxRecv int) ([]byte, *status) {
	if len(b) < 5 {
		return nil, &status{code: codes.Internal, message: "the request has no complete message"}
	}
	n := binary.BigEndian.Uint32(b[1:5])
	switch {
	case uint64(n) > uint64(maxRecv):
		return nil, &status{code: codes.ResourceExhausted, message: "request message larger than " + strconv.Itoa(maxRecv) + " bytes"}
	case uint64(len(b)-5) < uint64(n):
		return nil, &status{code: codes.Internal, message: "the request's message is cut short"}
	case uint64(len(b)-5) > uint64(n):
		return nil, &status{code: codes.Internal, message: "more than one request message for a unary method"}
	case b[0] == 1:
		return nil, &status{code: codes.Unimplemented, message: "compressed request messages are not supported"}
	case b[0] != 0:
		return nil, &status{code: codes.Internal, message: "invalid message flags"}
	}
	return b[5:], nil
}

// parseTimeout reads grpc-timeout: at most 8 digits and a unit (H, M, S, m,
// u, n).
func parseTimeout(v string) (d int64, ok bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit int64
	switch v[len(v)-1] {
	case 'H':
		unit = 3600e9
	case 'M':
		unit = 60e9
	case 'S':
		unit = 1e9
	case 'm':
		unit = 1e6
	case 'u':
		unit = 1e3
	case 'n':
		unit = 1
	default:
		return 0, false
	}
	if n > math.MaxInt64/unit {
		return math.MaxInt64, true
	}
	return n * unit, true
}

// encodeMessage percent-encodes grpc-message as gRPC specifies: bytes
// outside printable ASCII, and '%'. At most 1 KiB of the message is kept.
func encodeMessage(m string) string {
	m = m[:min(len(m), 1024)]
	const hex = "0123456789ABCDEF"
	var b []byte
	for i := 0; i < len(m); i++ {
		ch := m[i]
		if ch >= 0x20 && ch <= 0x7e && ch != '%' {
			if b != nil {
				b = append(b, ch)
			}
			continue
		}
		if b == nil {
			b = append(make([]byte, 0, len(m)+16), m[:i]...)
		}
		b = append(b, '%', hex[ch>>4], hex[ch&15])
	}
	if b == nil {
		return m
	}
	return string(b)
}

// Buffers for requests and answers; large ones are left to the collector.
const maxPooled = 64 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuf() *[]byte { b := bufs.Get().(*[]byte); *b = (*b)[:0]; return b }

func putBuf(b *[]byte) {
	if b != nil && cap(*b) <= maxPooled {
		bufs.Put(b)
	}
}
