package h2grpc

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/net/http2"
)

// What bounds a connection's life, besides its streams and bytes (conn.go).
// Each connection has a watcher, a timer that looks at it every second and
// never blocks the reader or the writers:
//
//   - idle: no call open and none opened for MaxConnectionIdle → GOAWAY,
//     close;
//   - age: MaxConnectionAge (±10%) after it opened → drain, then close once
//     its calls are answered or MaxConnectionAgeGrace has passed;
//   - keepalive: no frame from the client for KeepaliveTime → PING; still
//     nothing after KeepaliveTimeout → close (a peer gone without a FIN);
//   - slow requests: a call whose request is still incomplete after
//     RequestTimeout → GOAWAY ENHANCE_YOUR_CALM, close, so that a client
//     cannot hold streams and window open by trickling bytes;
//   - drain: the second GOAWAY if the client has not answered the first
//     one's PING within a second;
//   - floods: more frames that carry no call (SETTINGS, WINDOW_UPDATE,
//     PRIORITY, RST_STREAM, empty DATA, unknown types) in a second than
//     max(1,000, 50 per call answered in it) → GOAWAY ENHANCE_YOUR_CALM,
//     close: each costs the server a little work, and a flood of them,
//     unlimited, a core.
//
// A client's PINGs are policed where they are read (onPing), as grpc-go's
// keepalive enforcement polices them.

const (
	watchEvery        = time.Second
	drainPingTimeout  = time.Second
	maxPingStrikes    = 2
	defaultIdle       = 5 * time.Minute
	defaultAge        = 30 * time.Minute
	defaultAgeGrace   = 30 * time.Second
	defaultKeepalive  = 2 * time.Hour
	defaultKATimeout  = 20 * time.Second
	defaultMinPing    = 10 * time.Second
	defaultReqTimeout = 10 * time.Second
)

var (
	drainPing     = [8]byte{'s', 'l', 'u', 'i', 'c', 'e', 'g', 'a'}
	keepalivePing = [8]byte{'s', 'l', 'u', 'i', 'c', 'e', 'k', 'a'}

	errTooManyPings = errors.New("h2grpc: too many pings")
)

// watch is the watcher's state. Its fields but mu, timer and stopped are
// the watcher's alone: ticks run one after another.
type watch struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool

	ageAt      time.Time // when age drains the connection; zero: never
	graceEnd   time.Time // when a drained connection closes whatever it holds
	reads      uint64    // frames read at the last tick
	lastRead   time.Time
	idleSince  time.Time
	lastStream uint32
	pingSent   time.Time // a keepalive PING unanswered since; zero: none
	idleFrames int64     // at the last tick
	answered   int64
}

// maxIdleFrames is how many frames that carry no call a connection may
// send in a second, beyond those its answered calls allow (50 each).
const maxIdleFrames = 1000

// progress reports whether a frame carries a call: HEADERS, a DATA with
// bytes or ending its stream, or a PING (policed apart, by onPing).
func progress(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame, *http2.PingFrame:
		return true
	case *http2.DataFrame:
		return f.Length > 0 || f.StreamEnded()
	}
	return false
}

// jittered returns age give or take up to 10%, uniformly, so that the
// connections opened together are not all recycled together.
func jittered(age time.Duration) time.Duration {
	return age - age/10 + time.Duration(rand.Int64N(int64(age)/5+1))
}

// startWatch starts the watcher once the connection's prefaces are done.
func (c *conn) startWatch() {
	w := &c.w
	now := time.Now()
	w.lastRead, w.idleSince = now, now
	if age := orDefault(c.s.MaxConnectionAge, defaultAge); age > 0 {
		w.ageAt = now.Add(jittered(age))
	}
	c.lastAnswer.Store(now.UnixNano())
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		c.ready.Store(true)
		w.timer = time.AfterFunc(watchEvery, c.tick)
	}
}

func (c *conn) stopWatch() {
	w := &c.w
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (c *conn) tick() {
	if c.check(time.Now()) {
		w := &c.w
		w.mu.Lock()
		if !w.stopped {
			w.timer.Reset(watchEvery)
		}
		w.mu.Unlock()
	}
}

// check looks at the connection once, and reports whether it lives on.
func (c *conn) check(now time.Time) bool {
	s, w := c.s, &c.w
	if r := c.reads.Load(); r != w.reads {
		w.reads, w.lastRead, w.pingSent = r, now, time.Time{}
	}
	switch {
	case !w.pingSent.IsZero():
		if now.Sub(w.pingSent) >= orDefault(s.KeepaliveTimeout, defaultKATimeout) {
			c.close() // the client is gone
			return false
		}
	case now.Sub(w.lastRead) >= orDefault(s.KeepaliveTime, defaultKeepalive):
		c.lock()
		if !c.closed {
			c.fr.WritePing(false, keepalivePing)
		}
		c.release()
		w.pingSent = now
	}
	idle, answered := c.idleFrames.Load(), c.answered.Load()
	if idle-w.idleFrames > max(maxIdleFrames, 50*(answered-w.answered)) {
		c.goAwayThenClose(http2.ErrCodeEnhanceYourCalm)
		return false
	}
	w.idleFrames, w.answered = idle, answered
	if c.staleRequest(now, orDefault(s.RequestTimeout, defaultReqTimeout)) {
		c.goAwayThenClose(http2.ErrCodeEnhanceYourCalm)
		return false
	}
	if idle := orDefault(s.MaxConnectionIdle, defaultIdle); idle > 0 {
		if last := c.lastStream.Load(); c.active.Load() > 0 || last != w.lastStream {
			w.idleSince, w.lastStream = now, last
		} else if now.Sub(w.idleSince) >= idle {
			c.goAwayThenClose(http2.ErrCodeNo)
			return false
		}
	}
	if !w.ageAt.IsZero() && !now.Before(w.ageAt) && w.graceEnd.IsZero() {
		c.drain()
		w.graceEnd = now.Add(orDefault(s.MaxConnectionAgeGrace, defaultAgeGrace))
	}
	c.wmu.Lock()
	phase, pinged := c.drainPhase, c.drainPinged
	c.wmu.Unlock()
	if phase == 1 && now.Sub(pinged) >= drainPingTimeout {
		c.goAwayLast()
		phase = 2
	}
	if phase == 2 && c.idle() || !w.graceEnd.IsZero() && !now.Before(w.graceEnd) {
		c.close()
		return false
	}
	return true
}

// staleRequest reports whether a call's request has been incomplete, or
// an answer has waited for the client's window, for longer than d.
func (c *conn) staleRequest(now time.Time, d time.Duration) bool {
	c.wmu.Lock()
	held := len(c.blocked) > 0 && now.Sub(c.blocked[0].heldSince) > d // the oldest is first
	c.wmu.Unlock()
	if held {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.streams {
		if st.bidi == nil && !st.ended.Load() && now.Sub(st.opened) > d {
			return true
		}
	}
	return false
}

// drain starts a graceful end in two phases, as grpc-go does. A GOAWAY
// naming the largest stream id says no new call should be sent, while the
// calls the client is sending now are still taken; a PING follows it. The
// PING's answer (pingAcked) means every call the client sent before it read
// the GOAWAY has arrived: a second GOAWAY then names the last one taken,
// and anything later is refused. With one GOAWAY naming the last stream
// seen, a call in flight on the wire would be refused, and a client
// without retries would fail it (Envoy then fails open).
//
// A connection whose client has not yet sent its SETTINGS is drained the
// same way once the server's SETTINGS is out: the client may already have
// read it and be sending a call. Only one that has not reached that point
// is closed at once (no call can be on it).
func (c *conn) drain() {
	c.lock()
	if !c.prefaced && !c.closed {
		c.release()
		c.close()
		return
	}
	defer c.release()
	if c.closed || c.drainPhase > 0 {
		return
	}
	c.drainPhase, c.drainPinged = 1, time.Now()
	c.fr.WriteGoAway(math.MaxInt32, http2.ErrCodeNo, nil)
	c.fr.WritePing(false, drainPing)
}

// goAwayLast is drain's second phase.
func (c *conn) goAwayLast() {
	// Set before lastStream is read, as onHeaders stores lastStream before
	// it reads goingAway: a stream is either refused or named here.
	c.goingAway.Store(true)
	c.lock()
	defer c.release()
	if c.closed || c.drainPhase == 2 {
		return
	}
	c.drainPhase = 2
	c.fr.WriteGoAway(c.lastStream.Load(), http2.ErrCodeNo, nil)
	c.endStreams()
}

// drained reports whether drain's second GOAWAY is sent (or the connection
// is closed).
func (c *conn) drained() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.drainPhase == 2 || c.closed
}

func (c *conn) pingAcked(data [8]byte) {
	if data == drainPing {
		c.goAwayLast()
	}
}

// onPing answers a client's PING and polices their rate: one sooner than
// MinPingInterval after the previous, with no HEADERS or DATA sent since,
// is a strike, and more than maxPingStrikes end the connection.
func (c *conn) onPing(data [8]byte) error {
	now := time.Now()
	c.lock()
	defer c.release()
	if c.closed {
		return nil
	}
	c.fr.WritePing(true, data)
	if c.sentSincePing {
		c.sentSincePing, c.pingStrikes = false, 0
	} else if now.Sub(c.lastPingAt) < orDefault(c.s.MinPingInterval, defaultMinPing) {
		c.pingStrikes++
	}
	c.lastPingAt = now
	if c.pingStrikes > maxPingStrikes {
		c.fr.WriteGoAway(c.lastStream.Load(), http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"))
		return errTooManyPings
	}
	return nil
}
