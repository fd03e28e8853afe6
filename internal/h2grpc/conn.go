package h2grpc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// A connection has one reader goroutine and, while calls are answered, their
// handler goroutines as writers.
//
// The reader owns the receive side: it decodes frames, opens streams, counts
// request bytes against the windows it advertised and credits them back. The
// writers share the send side under wmu: the framer's write buffer, the hpack
// encoder (whose table is connection state, so header blocks must be encoded
// and written in one order) and the send windows, which the reader grows
// under wmu when WINDOW_UPDATE or SETTINGS arrive. Only a writer with DATA to
// send ever waits for a window, and the reader never sends DATA, so the
// reader can always run to deliver the update a writer waits for.
//
// The send side is in send.go; what a connection's life is bounded by
// (idle, age, keepalive, slow requests, PING floods) in watch.go.
//
// A stream counts against MaxConcurrentStreams from its HEADERS until the
// END_STREAM of its answer is written (RFC 9113 §5.1.2: an open or
// half-closed stream counts), or until it is reset. An answer the client
// has no window for is kept on its stream (pending) and written by the
// reader as WINDOW_UPDATEs arrive; no goroutine waits for it. So a client
// that never grants window holds at most MaxConcurrentStreams small answers
// and then gets REFUSED_STREAM for new calls until it reads: it cannot make
// the server grow.
type conn struct {
	s     *Server
	nc    net.Conn
	fr    *http2.Framer
	br    *bufio.Reader
	slots chan struct{} // the server's connection slots, one of them this connection's

	maxRecv      int
	streamWindow int64 // what each stream may send: the SETTINGS_INITIAL_WINDOW_SIZE advertised

	unfinished int // the reader's: streams whose request is not complete (MaxUnfinishedStreams)

	// active counts streams held against MaxConcurrentStreams: opened and
	// not yet answered (a reset stream's handler still counts until it
	// returns). lastStream is the highest stream id the client opened.
	active     atomic.Int32
	running    atomic.Int32 // handlers started and not yet done answering
	lastStream atomic.Uint32
	goingAway  atomic.Bool  // the second GOAWAY is sent: new streams are refused
	idleFrames atomic.Int64 // frames read that carried no call (progress)
	answered   atomic.Int64 // calls answered
	lastAnswer atomic.Int64 // when a call was last answered (or the connection ready), ns
	ready      atomic.Bool  // past the prefaces: the watcher runs
	reads      atomic.Uint64
	w          watch // the watcher's state (watch.go)

	// Request bytes inside the connection window, and those of them
	// already consumed, to be credited back: the reader's, and a stream
	// method's as it takes its messages (stream.go).
	connRecv, credit atomic.Int64

	mu      sync.Mutex // guards streams
	streams map[uint32]*stream

	wmu            sync.Mutex
	wcond          sync.Cond // on wmu: room in out, or the connection ended
	pending        atomic.Int32
	out            outBuffer // frames not yet written
	spare          []byte    // out's previous buffer, for reuse
	flushing       bool      // a writer is writing out without wmu
	henc           *hpack.Encoder
	hbuf           bytes.Buffer
	sendConn       int64 // the connection's send window
	peerInitWindow int64 // the client's SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame   int
	closed         bool
	prefaced       bool      // the server's SETTINGS is written: a GOAWAY may follow
	blocked        []*stream // answers waiting for send window, in order
	drainPhase     int       // 0, or the GOAWAY phase sent (drain)
	drainPinged    time.Time // when the first GOAWAY's PING was sent
	lastPingAt     time.Time // the client's last PING, for MinPingInterval
	pingStrikes    int
	sentSincePing  bool // HEADERS or DATA sent since the client's last PING

	closeOnce sync.Once
}

// stream is one call. The reader sets every field but sendDelta and reset
// before the handler starts, and does not change them after.
type stream struct {
	id        uint32
	path      string
	method    Method
	ctx       context.Context
	cancel    context.CancelFunc
	buf       *[]byte // the request as received: prefix and message; nil until its first DATA
	recv      int64   // flow-controlled bytes received
	early     *status // the answer of a request that will not run, sent once it is complete
	opened    time.Time
	held      int64       // the reader's: request bytes counted in Server.unfinishedBytes
	counted   bool        // the reader's: counted in conn.unfinished
	heldSince time.Time   // under wmu: when its answer began to wait for window
	ended     atomic.Bool // END_STREAM received (or the stream dropped): read by the watcher
	started   bool        // the handler runs
	sendDelta int64       // under wmu: the client's WINDOW_UPDATEs for this stream minus DATA sent on it
	reset     bool        // under wmu: the answer must not be sent
	pending   []byte      // under wmu: the answer's DATA not yet sent, for want of window
	finished  bool        // under wmu: no longer counted in active
	bidi      *bidi       // a stream method's call (stream.go); nil for a unary one
}

func newConn(s *Server, nc net.Conn) *conn {
	if s.TLSConfig != nil {
		cfg := s.TLSConfig.Clone()
		cfg.NextProtos = []string{"h2"}
		nc = tls.Server(nc, cfg)
	}
	c := &conn{
		s: s, nc: nc, maxRecv: s.maxRecv(), streams: map[uint32]*stream{},
		sendConn: 65535, peerInitWindow: 65535, peerMaxFrame: 16384,
	}
	c.streamWindow = min(int64(c.maxRecv)+5+16<<10, math.MaxInt32)
	c.lastAnswer.Store(time.Now().UnixNano()) // for eviction, a new connection is as good as one that just answered
	c.br = bufio.NewReaderSize(nc, 32<<10)
	c.fr = http2.NewFramer(&c.out, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = maxHeaderListSize
	c.fr.SetMaxReadFrameSize(16384)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.wcond.L = &c.wmu
	return c
}

func (c *conn) serve() {
	defer c.close()
	defer func() {
		// The connection's unfinished requests leave the server's counts
		// with it; nothing else changes them once the reader is gone. A
		// started call leaves when it is answered (finish).
		c.mu.Lock()
		for _, st := range c.streams {
			c.settle(st)
			if !st.started {
				c.s.openCalls.Add(-1)
			}
		}
		c.mu.Unlock()
	}()
	defer func() {
		// What a client sends cannot take the process down: a bug it
		// reaches here ends its connection and is reported.
		if v := recover(); v != nil && c.s.OnPanic != nil {
			c.s.OnPanic("", v)
		}
	}()
	c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	if tc, ok := c.nc.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil || tc.ConnectionState().NegotiatedProtocol != "h2" {
			return
		}
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	c.lock()
	c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.s.maxStreams()},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(c.streamWindow)},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
	)
	c.fr.WriteWindowUpdate(0, connWindow-65535)
	c.prefaced = true
	c.release()
	// The client's preface ends with its SETTINGS.
	f, err := c.fr.ReadFrame()
	if err != nil {
		return
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		c.goAwayThenClose(http2.ErrCodeProtocol)
		return
	}
	c.nc.SetDeadline(time.Time{})
	c.startWatch()
	for {
		c.reads.Add(1)
		if err == nil {
			if !progress(f) {
				c.idleFrames.Add(1)
			}
			err = c.handle(f)
		}
		if err != nil && !c.survive(err) {
			return
		}
		f, err = c.fr.ReadFrame()
	}
}

// survive answers a frame's error: a stream error resets that stream and the
// connection goes on; anything else ends the connection (a protocol error
// with GOAWAY first).
func (c *conn) survive(err error) bool {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		if se.StreamID%2 == 1 && se.StreamID > c.lastStream.Load() {
			c.lastStream.Store(se.StreamID) // a malformed HEADERS still used its id
		}
		c.mu.Lock()
		st := c.streams[se.StreamID]
		c.mu.Unlock()
		if st != nil {
			c.drop(st)
		}
		c.lock()
		c.fr.WriteRSTStream(se.StreamID, se.Code)
		c.release()
		return true
	case errors.As(err, &ce):
		c.goAwayThenClose(http2.ErrCode(ce))
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.goAwayThenClose(http2.ErrCodeFrameSize)
	case errors.Is(err, errTooManyPings):
		c.written() // onPing wrote its GOAWAY
	}
	return false
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.RSTStreamFrame:
		if f.StreamID > c.lastStream.Load() {
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		c.mu.Lock()
		st := c.streams[f.StreamID]
		c.mu.Unlock()
		if st != nil {
			c.drop(st)
		}
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
			return err
		}
		c.lock()
		f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingInitialWindowSize:
				c.peerInitWindow = int64(s.Val) // every stream's window moves by the difference
			case http2.SettingMaxFrameSize:
				c.peerMaxFrame = int(s.Val)
			case http2.SettingHeaderTableSize:
				c.henc.SetMaxDynamicTableSizeLimit(s.Val)
			}
			return nil
		})
		c.fr.WriteSettingsAck()
		c.drainBlocked()
		c.release()
	case *http2.PingFrame:
		if f.IsAck() {
			c.pingAcked(f.Data)
			return nil
		}
		return c.onPing(f.Data)
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol) // clients do not push
	}
	// PRIORITY, GOAWAY (the client closes when done) and unknown frames need
	// nothing.
	return nil
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	c.mu.Lock()
	st := c.streams[id]
	c.mu.Unlock()
	if st != nil { // trailers end the request
		if st.ended.Load() {
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
		}
		if !f.StreamEnded() {
			return http2.StreamError{StreamID: id, Code: http2.ErrCodeProtocol}
		}
		c.endOfBody(st)
		return nil
	}
	if id%2 == 0 || id <= c.lastStream.Load() {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	// Stored before goingAway is read, as Shutdown sets goingAway before it
	// reads lastStream: a stream is either refused or named in the GOAWAY.
	c.lastStream.Store(id)
	if c.goingAway.Load() || uint32(c.active.Load()) >= c.s.maxStreams() ||
		!f.StreamEnded() && c.unfinished >= c.s.maxUnfinished() ||
		c.s.openCalls.Load() >= c.s.maxOpenCalls() && c.active.Load() >= openCallsShare {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeRefusedStream}
	}
	var method, path, ctype, timeout string
	var md metadata.MD
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			ctype = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		default:
			if slices.Contains(c.s.KeepHeaders, hf.Name) {
				if md == nil {
					md = metadata.MD{}
				}
				md.Append(hf.Name, hf.Value)
			}
		}
	}
	method, path = f.PseudoValue("method"), f.PseudoValue("path")
	m := c.s.Methods[path]
	var sm StreamMethod
	if m == nil { // a unary call pays no second lookup
		sm = c.s.Streams[path]
	}
	if sm != nil && c.s.openStreams.Load() >= c.s.maxOpenStreams() {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeRefusedStream}
	}
	// A request that will not run is answered once it is complete (its
	// DATA read and dropped, within the stream's window), not at once with
	// RST_STREAM(NO_ERROR) while the client still sends: RFC 9113 allows
	// that, but some clients (curl) report the reset as an error.
	var early *status
	switch {
	case method != "POST":
		early = &status{http: "405"}
	case ctype != "application/grpc" && (len(ctype) < 17 || ctype[:17] != "application/grpc+" && ctype[:17] != "application/grpc;"):
		early = &status{http: "415"}
	case f.Truncated:
		early = &status{code: codes.ResourceExhausted, message: fmt.Sprintf("header list larger than %d bytes", maxHeaderListSize)}
	case m == nil && sm == nil:
		early = &status{code: codes.Unimplemented, message: "unknown method " + path}
	}
	st = &stream{id: id, path: path, method: m, early: early, opened: time.Now()}
	if d, ok := parseTimeout(timeout); ok {
		st.ctx, st.cancel = context.WithTimeout(context.Background(), time.Duration(d))
	} else {
		st.ctx, st.cancel = context.WithCancel(context.Background())
	}
	if md != nil {
		st.ctx = metadata.NewIncomingContext(st.ctx, md)
	}
	c.active.Add(1)
	c.s.openCalls.Add(1)
	c.mu.Lock()
	c.streams[id] = st
	c.mu.Unlock()
	if sm != nil && early == nil {
		c.startStream(st, sm, f.StreamEnded())
		return nil
	}
	if f.StreamEnded() {
		c.endOfBody(st)
		return nil
	}
	st.counted = true
	c.unfinished++
	return nil
}

// settle takes a stream out of the unfinished counts: its request is
// complete, or the stream is gone. The reader's, as every change to them is.
func (c *conn) settle(st *stream) {
	if st.counted {
		st.counted = false
		c.unfinished--
	}
	if st.held > 0 {
		c.s.unfinishedBytes.Add(-st.held)
		st.held = 0
	}
}

func (c *conn) onData(f *http2.DataFrame) error {
	id, n, data := f.StreamID, int64(f.Length), f.Data()
	if c.connRecv.Add(n) > connWindow {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	c.mu.Lock()
	st := c.streams[id]
	c.mu.Unlock()
	if st == nil {
		c.creditConn(n)
		if id > c.lastStream.Load() {
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		return nil // answered early or reset: what was in flight is ignored
	}
	if st.ended.Load() {
		c.creditConn(n)
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeStreamClosed}
	}
	if st.bidi != nil {
		return c.onStreamData(st, f)
	}
	st.recv += n
	if st.recv > c.streamWindow {
		return http2.StreamError{StreamID: id, Code: http2.ErrCodeFlowControl}
	}
	if st.early == nil {
		if len(data) > 0 && !f.StreamEnded() && c.s.unfinishedBytes.Load()+int64(len(data)) > c.s.maxUnfinishedBytes() {
			c.drop(st)
			c.answerNow(id, &status{code: codes.ResourceExhausted, message: "the server holds as many unfinished requests as it takes; send the request whole"}, false)
			return nil
		}
		if st.buf == nil {
			if f.StreamEnded() {
				st.buf = getBuf() // complete: run and given back at once
			} else {
				// Unfinished: held for as long as the client likes, so
				// sized to what came, not to a pooled buffer's 4 KiB.
				b := make([]byte, 0, len(data))
				st.buf = &b
			}
		}
		if len(*st.buf)+len(data) > 5+c.maxRecv {
			c.drop(st)
			c.answerNow(id, &status{code: codes.ResourceExhausted, message: fmt.Sprintf("request message larger than %d bytes", c.maxRecv)}, f.StreamEnded())
			return nil
		}
		*st.buf = append(*st.buf, data...)
		if !f.StreamEnded() {
			st.held += int64(len(data))
			c.s.unfinishedBytes.Add(int64(len(data)))
		}
	}
	if f.StreamEnded() {
		c.endOfBody(st)
	}
	return nil
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.lock()
		defer c.release()
		if c.sendConn+inc > math.MaxInt32 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		c.sendConn += inc
		c.drainBlocked()
		return nil
	}
	if f.StreamID > c.lastStream.Load() {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.mu.Lock()
	st := c.streams[f.StreamID]
	c.mu.Unlock()
	if st == nil {
		return nil
	}
	c.lock()
	defer c.release()
	if c.peerInitWindow+st.sendDelta+inc > math.MaxInt32 {
		return http2.StreamError{StreamID: f.StreamID, Code: http2.ErrCodeFlowControl}
	}
	st.sendDelta += inc
	if st.pending != nil {
		c.sendPending(st)
	}
	if testHookWindowUpdate != nil {
		testHookWindowUpdate()
	}
	return nil
}

// testHookWindowUpdate, set by tests, runs once a stream's WINDOW_UPDATE is
// applied.
var testHookWindowUpdate func()

// endOfBody starts the call once its request is complete.
func (c *conn) endOfBody(st *stream) {
	c.settle(st)
	st.ended.Store(true)
	c.creditConn(st.recv)
	if st.early != nil {
		c.drop(st)
		c.answerNow(st.id, st.early, true)
		return
	}
	var req []byte
	if st.buf != nil {
		req = *st.buf
	}
	msg, bad := unframe(req, c.maxRecv)
	if bad != nil {
		c.drop(st)
		c.answerNow(st.id, bad, true)
		return
	}
	st.started = true
	c.running.Add(1)
	c.s.dispatch(call{c, st, msg})
}

// drop forgets a stream the reader is done with: reset by the client, in
// error, or answered early. A running handler keeps its place in active
// until it returns; its answer is not sent.
func (c *conn) drop(st *stream) {
	c.mu.Lock()
	delete(c.streams, st.id)
	c.mu.Unlock()
	if !st.ended.Load() {
		c.settle(st)
		c.creditConn(st.recv)
		st.ended.Store(true)
	}
	st.cancel()
	if st.started {
		// Its handler, or its pending answer, still counts: the first to
		// see reset finishes the stream. A stream method's handler is
		// running, and finishes it when it returns.
		c.lock()
		st.reset = true
		if st.pending != nil {
			c.unblock(st)
			if st.bidi == nil {
				c.finish(st)
			}
		}
		c.release()
		if st.bidi != nil {
			c.creditConn(st.bidi.release(c.s))
		}
		return
	}
	putBuf(st.buf)
	c.active.Add(-1)
	c.s.openCalls.Add(-1)
}

// creditConn gives consumed request bytes back to the client's connection
// window, in batches of an eighth of it.
func (c *conn) creditConn(n int64) {
	if c.credit.Add(n) < connWindow/8 {
		return
	}
	n = c.credit.Swap(0)
	if n <= 0 {
		return
	}
	// Counted out before the client can know of it: the reader's check
	// is then laxer by no more than this update grants.
	c.connRecv.Add(-n)
	c.lock()
	c.fr.WriteWindowUpdate(0, uint32(n))
	c.release()
}

// run calls the method and answers.
func (c *conn) run(st *stream, msg []byte) {
	out := getBuf()
	body, bad := c.call(st, msg, (*out)[:0])
	st.cancel()
	if testHookBeforeAnswer != nil {
		testHookBeforeAnswer()
	}
	putBuf(st.buf) // the request is not kept while the answer waits to be written
	c.answer(st, body, bad)
	if body != nil && cap(body) <= maxPooled {
		*out = body[:0] // perhaps grown by the method
	}
	putBuf(out)
	c.running.Add(-1)
}

// idle reports whether every call taken is answered and written (or the
// connection is closed): what Shutdown waits for before it closes it.
func (c *conn) idle() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closed {
		return true
	}
	return c.active.Load() == 0 && c.running.Load() == 0 && !c.flushing && len(c.out.b) == 0
}

// testHookBeforeAnswer, set by tests, runs between a call's end and its
// answer.
var testHookBeforeAnswer func()

func (c *conn) goAwayWith(code http2.ErrCode) {
	c.lock()
	if !c.closed {
		c.fr.WriteGoAway(c.lastStream.Load(), code, nil)
	}
	c.release()
}

// goAwayThenClose sends GOAWAY with code and closes the connection once
// the frame is written, or writing failed (within the write timeout): a socket
// closed while another writer still flushes loses what it had not written,
// and the client sees the connection end without its reason.
func (c *conn) goAwayThenClose(code http2.ErrCode) {
	c.goAwayWith(code)
	c.written()
	c.close()
}

// written waits until what was appended to out so far is written, or
// writing failed.
func (c *conn) written() {
	c.wmu.Lock()
	for (len(c.out.b) > 0 || c.flushing) && !c.closed {
		if !c.flushing {
			c.flush()
			continue
		}
		c.wcond.Wait()
	}
	c.wmu.Unlock()
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.stopWatch()
		c.nc.Close()
		// Every call's context ends first: finishing a blocked answer
		// below takes its stream out of streams, and a streaming call's
		// method must still learn that its connection is gone.
		c.mu.Lock()
		for _, st := range c.streams {
			st.cancel()
		}
		c.mu.Unlock()
		c.wmu.Lock()
		c.closed = true
		for len(c.blocked) > 0 { // their bytes leave the server's count
			st := c.blocked[0]
			st.cancel()
			c.unblock(st)
			c.finish(st)
		}
		c.wcond.Broadcast()
		c.wmu.Unlock()
		c.s.forget(c)
	})
}
