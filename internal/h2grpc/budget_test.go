package h2grpc

import (
	"bytes"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Clients at every bound at once — requests left unfinished, answers given
// no window, answers never read — make the server hold no more than
// memoryBound says, and a client beside them is answered every time.
func TestClientsAtEveryBoundStayWithinTheBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("drives 48 connections to their bounds")
	}
	const perKind = 15
	f := newFixture(t, func(s *Server) {
		s.MaxConnections = 3*perKind + 3
		s.MaxUnfinishedBytes = 4 << 20
		s.MaxHeldAnswerBytes = 1 << 20
		// The attack must stay in place until it is measured: a starved
		// machine may take longer than the default 10 s to set it up, and
		// the connections holding requests unfinished, answers without
		// window or answers never read would end before it is whole.
		s.RequestTimeout = time.Hour
		s.writeTimeout = time.Hour
	})
	const answer = 4 << 10 // at least every answer here: 2 KiB echoed, framed, with its headers
	body := framed(bytes.Repeat([]byte("a"), 2<<10))

	innocent := dialRaw(t, f.addr) // a reader: its windows are never what it waits for
	innocent.fr.WriteWindowUpdate(0, math.MaxInt32-65535)
	innocent.call(1, "/t.T/Echo", body)
	if code, _ := innocent.grpcStatus(1); code != "0" {
		t.Fatalf("before the attack: grpc-status %s", code)
	}
	p99 := func(first uint32) time.Duration {
		var took []time.Duration
		for i := range 200 {
			id := first + uint32(2*i)
			start := time.Now()
			innocent.call(id, "/t.T/Echo", body)
			if code, msg := innocent.grpcStatus(id); code != "0" {
				t.Fatalf("the client beside the attackers, call %d: grpc-status %s (%s)", i, code, msg)
			}
			took = append(took, time.Since(start))
		}
		slices.Sort(took)
		return took[len(took)*99/100]
	}
	quiet := p99(3)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	var attackers sync.WaitGroup
	attack := func(do func(r *raw)) {
		r := dialRaw(t, f.addr)
		attackers.Add(1)
		go func() {
			defer attackers.Done()
			// A server that stops taking an attacker's bytes ends its
			// attack, as it would a real one's; what the attack left in
			// place is measured below.
			r.nc.SetWriteDeadline(time.Now().Add(patience))
			do(r)
		}()
	}
	for range perKind {
		attack(func(r *raw) { // requests left unfinished
			for i := range 128 {
				if r.send(uint32(2*i+1), "/t.T/Echo", nil) != nil || r.fr.WriteData(uint32(2*i+1), false, body[:2<<10]) != nil {
					return
				}
			}
		})
		attack(func(r *raw) { // answers given no window
			r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			for i := range 128 {
				if r.send(uint32(2*i+1), "/t.T/Echo", body) != nil {
					return
				}
			}
		})
		attack(func(r *raw) { // answers never read
			r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: math.MaxInt32})
			r.fr.WriteWindowUpdate(0, math.MaxInt32-65535)
			for i := range 1000 {
				if r.send(uint32(2*i+1), "/t.T/Echo", body) != nil {
					return
				}
			}
		})
	}
	attackers.Wait()
	// The server takes the attack in at the machine's pace: wait while it
	// makes progress, and fail only when it stalls short of the bound.
	for stalled, last := time.Now().Add(patience), int64(-1); f.s.heldAnswerBytes.Load() < 1<<20-int64(len(body)); time.Sleep(10 * time.Millisecond) {
		if n := f.s.heldAnswerBytes.Load() + f.s.openCalls.Load(); n != last {
			stalled, last = time.Now().Add(patience), n
		}
		if time.Now().After(stalled) {
			t.Fatalf("held answers stopped at %d bytes, want about 1 MiB", f.s.heldAnswerBytes.Load())
		}
	}

	// The attack is in place once the calls open stop changing: what the
	// client beside it meets is the server holding it, not taking it in.
	for last, still := int64(-1), 0; still < 10; time.Sleep(20 * time.Millisecond) {
		if n := f.s.openCalls.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	attacked := p99(403)
	unsent := 0
	f.s.mu.Lock()
	for c := range f.s.conns {
		c.wmu.Lock()
		unsent += len(c.out.b)
		c.wmu.Unlock()
	}
	f.s.mu.Unlock()
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	held := int64(during.HeapInuse+during.StackInuse) - int64(before.HeapInuse+before.StackInuse)
	bound := f.s.memoryBound(answer)
	if h := f.s.heldAnswerBytes.Load(); h < 1<<20-int64(len(body)) {
		t.Fatalf("the attack ended before it was measured: %d answer bytes held, want about 1 MiB", h)
	}
	t.Logf("held %.1f MiB of a bound of %.1f MiB (at the defaults: %.0f MiB); unfinished %d B, held answers %d B, unsent %d B, calls open %d; the client beside them: p99 %v, %v before",
		float64(held)/(1<<20), float64(bound)/(1<<20), float64(new(Server).memoryBound(answer))/(1<<20),
		f.s.unfinishedBytes.Load(), f.s.heldAnswerBytes.Load(), unsent, f.s.openCalls.Load(), attacked, quiet)
	if held > bound {
		t.Fatalf("clients at every bound made the server hold %d bytes, more than its bound of %d", held, bound)
	}
}
