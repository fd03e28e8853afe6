package h2grpc

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
)

// TestWindowUpdateDuringAFlushIsNotLost forces the interleaving a race
// showed once in a hundred runs: an answer out of send window is queued
// and its HEADERS are being written (a flush lets the send lock go while it
// writes) when the client's WINDOW_UPDATE for it is read. The update must
// not be lost: the answer's DATA and trailers follow. Hooks hold that
// flush until the update has been applied, on every run.
func TestWindowUpdateDuringAFlushIsNotLost(t *testing.T) {
	var armed atomic.Bool
	inFlush, applied, proceed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var holdOnce, appliedOnce sync.Once
	testHookFlushing = func() {
		if armed.Load() {
			holdOnce.Do(func() { close(inFlush); <-proceed })
		}
	}
	testHookWindowUpdate = func() {
		if armed.Load() {
			appliedOnce.Do(func() { close(applied) })
		}
	}
	defer func() { testHookWindowUpdate, testHookFlushing = nil, nil }()
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	// The connection's own frames (SETTINGS, their ACKs) go first.
	r.fr.WritePing(false, [8]byte{1})
	r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	armed.Store(true)

	body := []byte("no window yet")
	r.call(1, "/t.T/Echo", framed(body))
	// The answer's HEADERS are queued, its DATA waits for window, and the
	// flush writing the HEADERS waits in the hook, without the send lock:
	// the update is read and applied meanwhile.
	<-inFlush
	r.fr.WriteWindowUpdate(1, 1<<20)
	<-applied
	close(proceed)
	var got []byte
	for {
		fr := r.next(func(f http2.Frame) bool {
			switch f := f.(type) {
			case *http2.DataFrame:
				return f.StreamID == 1
			case *http2.MetaHeadersFrame:
				return f.StreamID == 1 && f.StreamEnded()
			}
			return false
		})
		if d, ok := fr.(*http2.DataFrame); ok {
			got = append(got, d.Data()...)
			continue
		}
		if code := get(fr.(*http2.MetaHeadersFrame), "grpc-status"); code != "0" {
			t.Fatalf("grpc-status %s", code)
		}
		break
	}
	if !bytes.Equal(got, framed(body)) {
		t.Fatalf("the answer arrived as %q", got)
	}
}
