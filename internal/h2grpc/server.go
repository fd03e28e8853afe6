// Package h2grpc serves gRPC methods over HTTP/2: unary ones, lean, and
// streaming ones (stream.go) under the same bounds.
//
// A rate limit service answers many small unary calls from a few long-lived
// connections (Envoy keeps one per worker thread). grpc-go serves them
// correctly but spends most of a call's CPU in its general transport:
// streaming, compression, interceptors, stats handlers, a goroutine and a
// context tree per call. This package keeps only what a unary call needs,
// straight on golang.org/x/net/http2's Framer and hpack:
//
//   - a call is HEADERS (POST, a known :path, content-type application/grpc*),
//     DATA carrying exactly one length-prefixed message, END_STREAM; the
//     answer is HEADERS (:status 200), one DATA message and the trailers
//     grpc-status and grpc-message, or trailers alone for an error;
//   - grpc-timeout becomes the call's context deadline; RST_STREAM and the
//     connection's end cancel it;
//   - answers from concurrent calls share one buffered writer, flushed by the
//     last writer out, so a busy connection answers many calls per write(2).
//
// What outside input can grow is bounded: streams per connection
// (MaxConcurrentStreams, excess refused with REFUSED_STREAM), a message
// (MaxRecvMsgSize, answered RESOURCE_EXHAUSTED), the request bytes one
// connection may hold (its connection window, credited back only when a
// call's message is complete, so unread data cannot pile up), and the header
// list (answered RESOURCE_EXHAUSTED). A reset stream still counts against
// MaxConcurrentStreams until its handler returns, so a reset flood cannot
// start more handlers than the limit.
//
// Not supported, answered as grpc-go answers them without the feature:
// compressed request messages (UNIMPLEMENTED), more than one message to a
// unary method (INTERNAL). Responses are never compressed.
package h2grpc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// A Method answers one call. req is the request message without gRPC's
// 5-byte prefix, valid only until the method returns. The method appends its
// response message to out and returns the result, or returns an error, whose
// gRPC status (google.golang.org/grpc/status.FromError) is the answer.
type Method func(ctx context.Context, req, out []byte) ([]byte, error)

// Server serves Methods on the connections of its listeners.
type Server struct {
	// Methods by full path, such as
	// "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit".
	Methods map[string]Method
	// Streams are the streaming methods by full path (stream.go), such as
	// "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas".
	Streams map[string]StreamMethod
	// KeepHeaders are the request header fields (lower case) a method sees
	// in its context as gRPC incoming metadata (metadata.FromIncomingContext),
	// as grpc-go passes every field: only these, so that a call whose
	// fields nobody reads allocates nothing for them (tracing keeps
	// traceparent and tracestate).
	KeepHeaders []string
	// MaxRecvMsgSize bounds a request message; 0 means 1 MiB.
	MaxRecvMsgSize int
	// MaxConcurrentStreams bounds the calls one connection has open; 0
	// means 1024.
	MaxConcurrentStreams uint32
	// TLSConfig, if set, serves TLS with ALPN "h2" (required, as grpc-go
	// requires it) instead of cleartext HTTP/2 with prior knowledge.
	TLSConfig *tls.Config
	// OnPanic, if set, is told of a panic: a method's (with its path),
	// answered INTERNAL, or one while reading a connection (with an empty
	// path), which ends that connection. The process goes on.
	OnPanic func(method string, v any)

	// MaxConnections bounds the connections served at once; beyond it,
	// Serve waits for one to end before it accepts another (the next
	// clients wait in the listener's backlog). 0 means 1024.
	MaxConnections int
	// MaxConnectionIdle ends a connection with no call open for this long:
	// GOAWAY, then close. 0 means 5 minutes; negative, never.
	MaxConnectionIdle time.Duration
	// MaxConnectionAge drains a connection this long after it opened, give
	// or take 10% so that reconnections spread: a two-phase GOAWAY, then
	// MaxConnectionAgeGrace for the calls in flight, then close. It lets a
	// client with long-lived connections (Envoy) move some of its calls
	// to a replica that started since. 0 means 30 minutes; negative, never.
	MaxConnectionAge time.Duration
	// MaxConnectionAgeGrace: see MaxConnectionAge. 0 means 30 s.
	MaxConnectionAgeGrace time.Duration
	// KeepaliveTime: after this long without a frame from the client, the
	// server sends it a PING, and closes the connection if no frame comes
	// within KeepaliveTimeout. 0 means 2 hours and 20 s, as grpc-go.
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MinPingInterval: a client PING sooner than this after the previous
	// one, with no HEADERS or DATA sent since, is a strike; the third ends
	// the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings", as
	// grpc-go's keepalive enforcement does. 0 means 10 s.
	MinPingInterval time.Duration
	// RequestTimeout bounds the time from a call's HEADERS to the end of
	// its request, and the time an answer waits for the client's window: a
	// connection holding a request unfinished, or an answer unread, for
	// longer ends (GOAWAY ENHANCE_YOUR_CALM). 0 means 10 s.
	RequestTimeout time.Duration
	// MaxUnfinishedStreams bounds the calls of one connection whose
	// request is not yet complete: beyond it that connection's next call
	// is refused (REFUSED_STREAM) until one completes. A client sends a
	// call's HEADERS and DATA together, so only a client that holds
	// requests open meets it. 0 means 128.
	MaxUnfinishedStreams int
	// MaxUnfinishedBytes bounds the request bytes held for calls not yet
	// complete, over all connections (a message sent in one frame with the
	// end of its stream is never held): a call whose next bytes would pass
	// it is answered RESOURCE_EXHAUSTED. 0 means 64 MiB.
	MaxUnfinishedBytes int64
	// MaxHeldAnswerBytes bounds the answer bytes held for clients whose
	// flow-control window has no room for them, over all connections: an
	// answer that would pass it is not held but answered
	// RESOURCE_EXHAUSTED (its decision stands). A client that reads keeps
	// its window open and never meets it. 0 means 16 MiB.
	MaxHeldAnswerBytes int64
	// MaxOpenCalls bounds the calls open over all connections (opened and
	// not yet answered, each with its state, request and answer): past it,
	// a connection with openCallsShare calls or more open has its next call
	// refused (REFUSED_STREAM), while one with fewer is still served, so
	// that the clients holding calls open meet it and the others do not.
	// 0 means 4,096.
	MaxOpenCalls int64
	// MaxOpenStreams bounds the streaming calls running over all
	// connections, apart from MaxOpenCalls so that long-lived streams do
	// not take the unary calls' room: past it a new one is refused
	// (REFUSED_STREAM). 0 means 4,096. What a streaming call's request
	// holds while its method has not taken it counts in MaxUnfinishedBytes.
	MaxOpenStreams int64

	// unfinishedBytes counts against MaxUnfinishedBytes; each connection's
	// reader adds and removes its own streams' share. heldAnswerBytes
	// counts against MaxHeldAnswerBytes, under each connection's wmu.
	unfinishedBytes atomic.Int64
	heldAnswerBytes atomic.Int64
	openCalls       atomic.Int64 // counts against MaxOpenCalls
	openStreams     atomic.Int64 // streaming calls running, against MaxOpenStreams

	// writeTimeout, when set, replaces defaultWriteTimeout: a test that
	// holds clients at their bounds keeps them there while it measures.
	writeTimeout time.Duration

	workers  sync.Once
	nworkers atomic.Int32
	calls    chan call     // to an idle worker
	quit     chan struct{} // closed when the server closes
	quitOnce sync.Once

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	slots     chan struct{} // one per connection served: MaxConnections
}

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("h2grpc: server closed")

const (
	defaultMaxRecvMsgSize = 1 << 20
	defaultMaxStreams     = 1024
	defaultMaxConnections = 1024
	// connWindow is what one connection may send before its calls' messages
	// are complete: the most request bytes it can make the server hold. It
	// holds one message of the largest size (MaxRecvMsgSize's default) and
	// then some.
	connWindow = 2 << 20
	// maxHeaderListSize bounds a call's decoded header list.
	maxHeaderListSize = 16 << 10
	// handshakeTimeout bounds the TLS handshake and the client preface.
	handshakeTimeout = 10 * time.Second
	// defaultWriteTimeout bounds one write to a client that does not read.
	defaultWriteTimeout = 10 * time.Second
	// maxOutBuffered bounds the frames a connection holds unwritten, beyond
	// the write in progress: a writer finding it full waits. An answer is at
	// most a few KiB (64 descriptors), so it holds hundreds of them: enough
	// that no write waits on a busy connection, little enough that 1,024
	// clients that stop reading hold at most about 2 x 64 KiB each.
	maxOutBuffered = 64 << 10
	// maxSpare is the largest written buffer a connection keeps for its
	// next frames; a larger one, from a burst, goes back to the heap so that
	// an idle connection does not keep it.
	maxSpare = 16 << 10
)

const (
	defaultMaxUnfinished      = 128
	defaultMaxUnfinishedBytes = 64 << 20
	defaultMaxHeldAnswerBytes = 16 << 20
	defaultMaxOpenCalls       = 4 << 10
	defaultMaxOpenStreams     = 4 << 10
	// openCallsShare is the calls a connection may always have open: past
	// MaxOpenCalls only a connection with more is refused, so the calls
	// open are at most MaxOpenCalls + MaxConnections x openCallsShare.
	openCallsShare = 8
)

func (s *Server) maxUnfinished() int {
	if s.MaxUnfinishedStreams > 0 {
		return s.MaxUnfinishedStreams
	}
	return defaultMaxUnfinished
}

func (s *Server) maxUnfinishedBytes() int64 {
	if s.MaxUnfinishedBytes > 0 {
		return s.MaxUnfinishedBytes
	}
	return defaultMaxUnfinishedBytes
}

func (s *Server) maxHeldAnswerBytes() int64 {
	if s.MaxHeldAnswerBytes > 0 {
		return s.MaxHeldAnswerBytes
	}
	return defaultMaxHeldAnswerBytes
}

func (s *Server) maxOpenStreams() int64 {
	if s.MaxOpenStreams > 0 {
		return s.MaxOpenStreams
	}
	return defaultMaxOpenStreams
}

func (s *Server) maxOpenCalls() int64 {
	if s.MaxOpenCalls > 0 {
		return s.MaxOpenCalls
	}
	return defaultMaxOpenCalls
}

// What a connection and an open call cost at most, measured by
// TestClientsAtEveryBoundStayWithinTheBudget: a connection's read and frame
// buffers, header tables and maps; a call's state, context and, while its
// answer waits to be written, its goroutine's stack.
const (
	connBytes = 96 << 10
	callBytes = 10 << 10
)

// memoryBound is the most that clients at every bound can make the server
// hold, with answers of at most answer bytes: the unfinished requests and
// the held answers over all connections, every call that may be open (and
// its answer, waiting to be written), and each connection's buffers and
// unsent frames (the write in progress and out, each up to maxOutBuffered
// and one answer). docs/security.md states it for the defaults.
func (s *Server) memoryBound(answer int64) int64 {
	conns := int64(defaultMaxConnections)
	if s.MaxConnections > 0 {
		conns = int64(s.MaxConnections)
	}
	calls := s.maxOpenCalls() + conns*openCallsShare
	return s.maxUnfinishedBytes() + s.maxHeldAnswerBytes() +
		calls*(callBytes+answer) +
		conns*(connBytes+2*(maxOutBuffered+answer))
}

func (s *Server) maxRecv() int {
	if s.MaxRecvMsgSize > 0 {
		return s.MaxRecvMsgSize
	}
	return defaultMaxRecvMsgSize
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (s *Server) maxStreams() uint32 {
	if s.MaxConcurrentStreams > 0 {
		return s.MaxConcurrentStreams
	}
	return defaultMaxStreams
}

// Serve accepts connections on l and serves each on its own goroutine until
// l fails or the server is shut down; it then returns the error, or
// ErrServerClosed.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
	}
	s.listeners[l] = struct{}{}
	if s.slots == nil {
		n := s.MaxConnections
		if n <= 0 {
			n = defaultMaxConnections
		}
		s.slots = make(chan struct{}, n)
	}
	slots := s.slots
	s.mu.Unlock()
	s.startWorkers()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err == nil && !s.room(slots) {
			nc.Close()
			return ErrServerClosed
		}
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			nc.Close()
			<-slots
			return ErrServerClosed
		}
		c.slots = slots
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go c.serve()
	}
}

// idleEviction is how long a connection must have gone without answering a
// call to be ended for a new one when the server is at MaxConnections.
const idleEviction = time.Second

// room takes a connection slot for a connection just accepted. At
// MaxConnections it makes room by ending the connection that has gone
// longest without answering a call, if that is at least idleEviction, so
// that idle connections cannot lock everyone else out; while every
// connection is busy it waits for one to end, looking again every 250 ms.
// It reports false if the server closes meanwhile.
func (s *Server) room(slots chan struct{}) bool {
	for {
		select {
		case slots <- struct{}{}: // released when the connection ends
			return true
		default:
		}
		s.evictIdle()
		select {
		case slots <- struct{}{}:
			return true
		case <-s.quit:
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// evictIdle ends the connection that has gone longest without answering a
// call, if that is at least idleEviction.
func (s *Server) evictIdle() {
	cutoff := time.Now().Add(-idleEviction).UnixNano()
	var victim *conn
	oldest := cutoff
	s.mu.Lock()
	for c := range s.conns {
		if t := c.lastAnswer.Load(); t <= oldest {
			victim, oldest = c, t
		}
	}
	s.mu.Unlock()
	if victim != nil {
		if victim.ready.Load() {
			victim.goAwayWith(http2.ErrCodeNo)
		}
		victim.close()
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	if c.slots != nil {
		<-c.slots
	}
}

// Shutdown stops accepting, drains every connection with a two-phase GOAWAY
// (see conn.drain: calls the client sent before it learnt of the shutdown
// are still served), waits for the calls taken to be answered, then closes
// the connections. If ctx ends first it closes them at once and returns
// ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	conns := s.stopAccepting()
	for _, c := range conns {
		c.drain()
	}
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		busy := false
		// A client still in its handshake a second after the first
		// GOAWAY (its SETTINGS not come) has no call in flight: closed,
		// rather than waited for up to handshakeTimeout.
		late := time.Since(start) >= drainPingTimeout
		for _, c := range conns {
			if c.drained() && c.idle() || late && !c.ready.Load() {
				c.close()
			} else {
				busy = true
			}
		}
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			s.Close()
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close stops accepting and closes every connection; calls in flight are
// cancelled and their answers dropped.
func (s *Server) Close() error {
	for _, c := range s.stopAccepting() {
		c.close()
	}
	return nil
}

func (s *Server) stopAccepting() []*conn {
	s.startWorkers() // so that quit exists
	s.quitOnce.Do(func() { close(s.quit) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// A call is a method's work, handed to a worker.
type call struct {
	c   *conn
	st  *stream
	msg []byte
}

// Calls run on workers: long-lived goroutines whose stacks have grown, once,
// to what a method needs, where a new goroutine per call grows (copies) its
// stack on every call, which was a fifth of the CPU a call took. A call goes
// to an idle worker; if none is idle, a new worker starts, up to maxWorkers;
// beyond that a call runs on a goroutine of its own.
const maxWorkers = 256

func (s *Server) startWorkers() {
	s.workers.Do(func() {
		s.calls, s.quit = make(chan call), make(chan struct{})
	})
}

func (s *Server) dispatch(x call) {
	select {
	case s.calls <- x:
		return
	default:
	}
	if s.nworkers.Add(1) > maxWorkers {
		s.nworkers.Add(-1)
		go x.c.run(x.st, x.msg)
		return
	}
	go func() {
		defer s.nworkers.Add(-1)
		for {
			x.c.run(x.st, x.msg)
			select {
			case x = <-s.calls:
			case <-s.quit:
				return
			}
		}
	}()
}

// status is a call's outcome as its trailers say it, or for a request that
// is not a gRPC call, the HTTP status that answers it.
type status struct {
	code    codes.Code
	message string
	http    string
}
