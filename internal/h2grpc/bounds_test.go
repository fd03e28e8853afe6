package h2grpc

// The bounds a hostile client meets over all connections: unfinished
// requests, held answers, open calls.

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Unfinished requests are bounded: past MaxUnfinishedStreams a
// connection's next call is refused (REFUSED_STREAM), on that connection
// only; past MaxUnfinishedBytes, over all connections, the call whose
// bytes would pass it is answered RESOURCE_EXHAUSTED. Calls that complete,
// and connections that end, give their share back.
func TestUnfinishedRequestsAreBounded(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxUnfinishedStreams = 2; s.MaxUnfinishedBytes = 1000 })
	endOf := func(r *raw, id uint32) http2.Frame {
		t.Helper()
		return r.next(func(f http2.Frame) bool {
			if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.StreamID == id {
				return true
			}
			h, ok := f.(*http2.MetaHeadersFrame)
			return ok && h.StreamID == id && h.StreamEnded()
		})
	}
	waitBytes := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(patience); f.s.unfinishedBytes.Load() != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d unfinished bytes, want %d", f.s.unfinishedBytes.Load(), n)
			}
		}
	}
	a, b := dialRaw(t, f.addr), dialRaw(t, f.addr)
	for _, id := range []uint32{1, 3} {
		a.call(id, "/t.T/Echo", nil)
		a.fr.WriteData(id, false, message([]byte("12345"))) // a prefix, no message yet
	}
	a.call(5, "/t.T/Echo", nil)
	if rst, ok := endOf(a, 5).(*http2.RSTStreamFrame); !ok || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatal("a third unfinished call on a connection allowed two was not refused")
	}
	b.call(1, "/t.T/Echo", framed([]byte("whole"))) // another connection is served
	if code, _ := b.grpcStatus(1); code != "0" {
		t.Fatalf("a call on another connection: grpc-status %s", code)
	}
	// Completing one gives its place back.
	a.fr.WriteData(1, true, []byte("12345"))
	if code, _ := a.grpcStatus(1); code != "0" {
		t.Fatalf("completing an unfinished call: grpc-status %s", code)
	}
	waitBytes(5) // stream 3's prefix
	b.call(3, "/t.T/Echo", nil)
	b.fr.WriteData(3, false, framed(make([]byte, 900))[:905])
	b.fr.WriteData(3, false, make([]byte, 600)) // 5 + 905 + 600 held: over 1,000
	if h, ok := endOf(b, 3).(*http2.MetaHeadersFrame); !ok || get(h, "grpc-status") != "8" {
		t.Fatal("bytes past MaxUnfinishedBytes were not answered RESOURCE_EXHAUSTED")
	}
	waitBytes(5)
	// A connection that ends gives its unfinished calls back.
	a.nc.Close()
	waitBytes(0)
	whole := framed(make([]byte, 1000))
	b.call(5, "/t.T/Echo", nil)
	b.fr.WriteData(5, false, whole[:1000]) // the whole budget, a's 5 given back
	b.fr.WriteData(5, true, whole[1000:])
	if code, _ := b.grpcStatus(5); code != "0" {
		t.Fatalf("a call holding exactly the budget once the other connection ended: grpc-status %s", code)
	}
}

// An unfinished request costs what it sent, not a pooled buffer: 2,000
// calls holding 5 bytes each grow the heap by less than 1 KiB a call (a
// 4 KiB buffer each before).
func TestAnUnfinishedRequestCostsWhatItSent(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxUnfinishedStreams = 1000 })
	conns := []*raw{dialRaw(t, f.addr), dialRaw(t, f.addr)}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for _, r := range conns {
		for i := range 1000 {
			id := uint32(2*i + 1)
			r.call(id, "/t.T/Echo", nil)
			r.fr.WriteData(id, false, message([]byte("12345")))
		}
	}
	for deadline := time.Now().Add(patience); f.s.unfinishedBytes.Load() < 2000*5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d unfinished bytes seen, want 10,000", f.s.unfinishedBytes.Load())
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	per := (int64(m1.HeapAlloc) - int64(m0.HeapAlloc)) / 2000
	t.Logf("%d bytes of heap per unfinished call", per)
	if per > 1024 {
		t.Fatalf("%d bytes of heap per unfinished call of 5 bytes, want under 1 KiB", per)
	}
}

// An answer the client gives no window for waits at most RequestTimeout:
// then the connection ends (GOAWAY ENHANCE_YOUR_CALM), as one holding a
// request unfinished does, and what it held is freed.
func TestAnAnswerHeldForWindowEndsItsConnectionAtTheTimeout(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.RequestTimeout = 300 * time.Millisecond })
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.call(1, "/t.T/Echo", framed([]byte("never read")))
	if code := r.goAway(); code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
	}
}

// Answers held for clients that give them no window are bounded over all
// connections: past MaxHeldAnswerBytes the newcomer is answered
// RESOURCE_EXHAUSTED instead of held, a client that reads is served as
// before, and a reset stream or an ended connection gives its bytes back.
func TestHeldAnswersAreBoundedOverAllConnections(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxHeldAnswerBytes = 90 }) // two held answers exactly
	heldBecomes := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(patience); f.s.heldAnswerBytes.Load() != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d answer bytes held, want %d", f.s.heldAnswerBytes.Load(), n)
			}
		}
	}
	headersOf := func(r *raw, id uint32) {
		t.Helper()
		r.next(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamID == id })
	}
	body := bytes.Repeat([]byte("x"), 40) // 45 bytes framed
	a := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	b := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	a.call(1, "/t.T/Echo", framed(body))
	headersOf(a, 1)
	heldBecomes(45)
	b.call(1, "/t.T/Echo", framed(body))
	headersOf(b, 1)
	heldBecomes(90)

	a.call(3, "/t.T/Echo", framed(body))
	if code, msg := a.grpcStatus(3); code != "8" {
		t.Fatalf("an answer past the bound: grpc-status %s (%s), want 8 RESOURCE_EXHAUSTED", code, msg)
	}
	heldBecomes(90)

	reader := dialRaw(t, f.addr)
	reader.call(1, "/t.T/Echo", framed(body))
	if code, _ := reader.grpcStatus(1); code != "0" {
		t.Fatalf("a client that reads, beside the held answers: grpc-status %s, want 0", code)
	}
	exact := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 45})
	exact.call(1, "/t.T/Echo", framed(body))
	if code, _ := exact.grpcStatus(1); code != "0" {
		t.Fatalf("an answer its window holds exactly, beside the held answers: grpc-status %s, want 0", code)
	}

	b.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	heldBecomes(45)
	a.nc.Close()
	heldBecomes(0)
}

// Calls open are bounded over all connections: past MaxOpenCalls a
// connection holding openCallsShare calls or more has its next refused,
// one with fewer is served, and calls answered, unfinished or on an ended
// connection leave the count.
func TestOpenCallsAreBoundedOverAllConnections(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxOpenCalls = 20 })
	openBecomes := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(patience); f.s.openCalls.Load() != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d calls open, want %d", f.s.openCalls.Load(), n)
			}
		}
	}
	holder := dialRaw(t, f.addr)
	for i := range 20 {
		holder.call(uint32(2*i+1), "/t.T/Hold", framed(nil))
	}
	openBecomes(20)
	holder.call(41, "/t.T/Hold", framed(nil))
	rst := holder.next(func(f http2.Frame) bool { r, ok := f.(*http2.RSTStreamFrame); return ok && r.StreamID == 41 }).(*http2.RSTStreamFrame)
	if rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("a call past the bound on the connection holding them: RST_STREAM %v, want REFUSED_STREAM", rst.ErrCode)
	}

	// Past the bound, a connection holding its share (8) gets no more.
	eight := dialRaw(t, f.addr)
	for i := range openCallsShare {
		eight.call(uint32(2*i+1), "/t.T/Echo", nil)
	}
	openBecomes(20 + openCallsShare)
	eight.call(2*openCallsShare+1, "/t.T/Echo", framed(nil))
	rst = eight.next(func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.StreamID == 2*openCallsShare+1
	}).(*http2.RSTStreamFrame)
	if rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("a call past the bound on a connection holding its share: RST_STREAM %v, want REFUSED_STREAM", rst.ErrCode)
	}
	eight.nc.Close()
	openBecomes(20)

	unfinished := dialRaw(t, f.addr)
	for i := range 5 {
		unfinished.call(uint32(2*i+1), "/t.T/Echo", nil)
	}
	openBecomes(25)
	other := dialRaw(t, f.addr)
	other.call(1, "/t.T/Echo", framed([]byte("beside them")))
	if code, _ := other.grpcStatus(1); code != "0" {
		t.Fatalf("a call from a connection holding none, past the bound: grpc-status %s, want 0", code)
	}
	unfinished.fr.WriteRSTStream(1, http2.ErrCodeCancel) // a call reset before its request came whole
	openBecomes(24)
	unfinished.nc.Close()
	openBecomes(20)
	close(f.release)
	for answered := 0; answered < 20; {
		h := holder.next(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamEnded() }).(*http2.MetaHeadersFrame)
		if code := get(h, "grpc-status"); code != "0" {
			t.Fatalf("held call on stream %d: grpc-status %s", h.StreamID, code)
		}
		answered++
	}
	openBecomes(0)
}

// A held answer's bytes leave the count as the client's window takes them,
// part by part, not only when the answer is all sent.
func TestAHeldAnswerIsCountedAsItDrains(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.call(1, "/t.T/Echo", framed(bytes.Repeat([]byte("x"), 40))) // 45 bytes framed
	r.next(func(f http2.Frame) bool { h, ok := f.(*http2.MetaHeadersFrame); return ok && h.StreamID == 1 })
	for _, c := range []struct {
		grant uint32
		held  int64
	}{{0, 45}, {10, 35}, {30, 5}, {5, 0}} {
		if c.grant > 0 {
			r.fr.WriteWindowUpdate(1, c.grant)
		}
		for deadline := time.Now().Add(patience); f.s.heldAnswerBytes.Load() != c.held; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after granting %d: %d bytes held, want %d", c.grant, f.s.heldAnswerBytes.Load(), c.held)
			}
		}
	}
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("grpc-status %s", code)
	}
}
