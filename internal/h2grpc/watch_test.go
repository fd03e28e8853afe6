package h2grpc

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// watched dials f's server and returns the raw client and the server's side
// of the connection, its watcher's timer stopped: the test drives check with
// instants of its own.
func watched(t *testing.T, f *fixture) (*raw, *conn) {
	t.Helper()
	r := dialRaw(t, f.addr)
	r.next(func(f http2.Frame) bool { _, ok := f.(*http2.SettingsFrame); return ok })
	r.fr.WritePing(false, [8]byte{'w'}) // answered once the prefaces are done
	r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	f.s.mu.Lock()
	var c *conn
	for c = range f.s.conns {
	}
	f.s.mu.Unlock()
	c.w.mu.Lock()
	stopped := c.w.timer != nil && c.w.timer.Stop()
	c.w.mu.Unlock()
	if !stopped {
		t.Skip("the watcher ticked before the test could stop it (a machine stalled for a second)")
	}
	return r, c
}

// TestIdleConnectionsEndAfterMaxConnectionIdle: a connection with no call
// open for exactly MaxConnectionIdle gets GOAWAY(NO_ERROR) and is closed; a
// call running, or a new stream since the last look, keeps it open.
func TestIdleConnectionsEndAfterMaxConnectionIdle(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxConnectionIdle = time.Minute })
	r, c := watched(t, f)
	start := c.w.idleSince
	r.call(1, "/t.T/Hold", framed(nil))
	for c.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if !c.check(start.Add(2 * time.Minute)) {
		t.Fatal("closed while a call runs")
	}
	f.release <- struct{}{}
	r.grpcStatus(1)
	idleFrom := start.Add(2 * time.Minute) // the last look that saw a call
	if !c.check(idleFrom.Add(time.Minute - 1)) {
		t.Fatal("closed a nanosecond before MaxConnectionIdle")
	}
	if c.check(idleFrom.Add(time.Minute)) {
		t.Fatal("still open after exactly MaxConnectionIdle with no call")
	}
	if got := r.goAway(); got != http2.ErrCodeNo {
		t.Fatalf("GOAWAY %v, want NO_ERROR", got)
	}
}

// TestAConnectionIsRecycledAtItsAge: at its age, within 10% of
// MaxConnectionAge, not a nanosecond before, a connection starts draining:
// a first GOAWAY naming stream 2^31-1.
func TestAConnectionIsRecycledAtItsAge(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxConnectionAge, s.MaxConnectionIdle = time.Hour, -1 })
	r, c := watched(t, f)
	start := c.w.lastRead
	if c.w.ageAt.Before(start.Add(54*time.Minute)) || c.w.ageAt.After(start.Add(66*time.Minute)) {
		t.Fatalf("age at %v after the start, want within 10%% of an hour", c.w.ageAt.Sub(start))
	}
	at := c.w.ageAt
	c.check(at.Add(-1))
	c.wmu.Lock()
	phase := c.drainPhase
	c.wmu.Unlock()
	if phase != 0 {
		t.Fatal("draining before its age")
	}
	c.check(at)
	first := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if first.LastStreamID != 1<<31-1 {
		t.Fatalf("the first GOAWAY names stream %d, want 2^31-1", first.LastStreamID)
	}
}

// TestADrainWaitsDrainPingTimeoutForThePing: a client that does not answer
// the drain's PING gets the second GOAWAY after exactly drainPingTimeout.
func TestADrainWaitsDrainPingTimeoutForThePing(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxConnectionIdle = -1 })
	_, c := watched(t, f)
	c.drain()
	c.wmu.Lock()
	pinged := c.drainPinged
	c.wmu.Unlock()
	phaseAt := func(now time.Time) int {
		c.check(now)
		c.wmu.Lock()
		defer c.wmu.Unlock()
		return c.drainPhase
	}
	if p := phaseAt(pinged.Add(drainPingTimeout - 1)); p != 1 {
		t.Fatalf("phase %d a nanosecond before the PING's timeout, want 1", p)
	}
	if p := phaseAt(pinged.Add(drainPingTimeout)); p != 2 {
		t.Fatalf("phase %d at the PING's timeout, want 2", p)
	}
}

// TestIdleFramesArePolicedPerLook: more than maxIdleFrames frames that
// carry nothing between two looks, beyond 50 per call answered, end the
// connection; exactly maxIdleFrames do not.
func TestIdleFramesArePolicedPerLook(t *testing.T) {
	f := newFixture(t, nil)
	r, c := watched(t, f)
	now := c.w.lastRead
	r.call(1, "/t.T/Echo", nil) // open: its request never ends
	c.check(now)                // counts from here: the handshake's frames are idle frames too
	idle := func(n int64) {
		t.Helper()
		want := c.idleFrames.Load() + n
		for range n {
			r.fr.WriteData(1, false, nil)
		}
		for c.idleFrames.Load() < want {
			time.Sleep(time.Millisecond)
		}
	}
	idle(maxIdleFrames)
	if now = now.Add(time.Second); !c.check(now) {
		t.Fatal("cut after exactly maxIdleFrames idle frames")
	}
	idle(1)
	if now = now.Add(time.Second); !c.check(now) {
		t.Fatal("cut after one idle frame since the last look")
	}
	for id := uint32(3); id < 3+2*30; id += 2 { // 30 calls answered: room for 1,500
		r.call(id, "/t.T/Echo", framed(nil))
		r.grpcStatus(id)
	}
	idle(1500)
	if now = now.Add(time.Second); !c.check(now) {
		t.Fatal("cut after 1,500 idle frames beside 30 answers")
	}
	for id := uint32(63); id < 63+2*30; id += 2 {
		r.call(id, "/t.T/Echo", framed(nil))
		r.grpcStatus(id)
	}
	idle(1501)
	if now = now.Add(time.Second); c.check(now) {
		t.Fatal("not cut after 1,501 idle frames beside 30 answers")
	}
	if got := r.goAway(); got != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", got)
	}
}

// TestWorkersEndWithTheServer: once the server is closed, its workers end.
func TestWorkersEndWithTheServer(t *testing.T) {
	f := newFixture(t, nil)
	if _, err := invoke(context.Background(), f.client(t), "/t.T/Echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if f.s.nworkers.Load() == 0 {
		t.Fatal("no worker ran the call")
	}
	f.s.Close()
	for deadline := time.Now().Add(patience); f.s.nworkers.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers 10 s after the server closed", f.s.nworkers.Load())
		}
	}
}

// TestKeepaliveFollowsTheClientsFrames: a client that sent a frame since
// the last look gets no keepalive PING; one quiet for KeepaliveTime gets
// one, and is taken for gone KeepaliveTimeout after it, to the nanosecond.
func TestKeepaliveFollowsTheClientsFrames(t *testing.T) {
	f := newFixture(t, func(s *Server) {
		s.KeepaliveTime, s.KeepaliveTimeout, s.MaxConnectionIdle = time.Minute, 20*time.Second, -1
	})
	r, c := watched(t, f)
	base := c.w.lastRead
	c.check(base) // counts the handshake's reads
	reads := c.reads.Load()
	r.fr.WritePing(false, [8]byte{'a'})
	for c.reads.Load() == reads {
		time.Sleep(time.Millisecond)
	}
	if !c.check(base.Add(2*time.Minute)) || !c.w.pingSent.IsZero() {
		t.Fatal("a keepalive PING to a client that just sent a frame")
	}
	quiet := base.Add(2 * time.Minute)
	c.check(quiet.Add(time.Minute - 1))
	if !c.w.pingSent.IsZero() {
		t.Fatal("a keepalive PING a nanosecond before KeepaliveTime")
	}
	c.check(quiet.Add(time.Minute))
	if c.w.pingSent.IsZero() {
		t.Fatal("no keepalive PING after KeepaliveTime quiet")
	}
	if !c.check(quiet.Add(time.Minute + 20*time.Second - 1)) {
		t.Fatal("closed a nanosecond before KeepaliveTimeout")
	}
	if c.check(quiet.Add(time.Minute + 20*time.Second)) {
		t.Fatal("still open KeepaliveTimeout after an unanswered keepalive PING")
	}
}

// TestWorkersAreBounded: calls past maxWorkers at once run on goroutines
// of their own, and the workers stay maxWorkers.
func TestWorkersAreBounded(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	const calls = maxWorkers + 40
	for i := range calls {
		r.call(uint32(2*i+1), "/t.T/Hold", framed(nil))
	}
	for deadline := time.Now().Add(patience); f.s.openCalls.Load() != calls; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls open, want %d", f.s.openCalls.Load(), calls)
		}
	}
	if n := f.s.nworkers.Load(); n > maxWorkers {
		t.Fatalf("%d workers for %d calls at once, want at most %d", n, calls, maxWorkers)
	}
	close(f.release)
}
