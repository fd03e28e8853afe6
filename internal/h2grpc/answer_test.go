package h2grpc

import "testing"

// The pool of answer buffers keeps buffers up to maxPooled, never larger
// ones: a client's one huge answer must not stay in memory after it.
func TestOnlyBuffersUpToTheBoundArePooled(t *testing.T) {
	for range 10 {
		big := make([]byte, 0, maxPooled+1)
		putBuf(&big)
		if b := getBuf(); cap(*b) > maxPooled {
			t.Fatalf("a pooled buffer of %d bytes, past the bound of %d", cap(*b), maxPooled)
		}
	}
	at := make([]byte, 0, maxPooled) // sync.Pool may drop any Put: try a few times
	for range 10 {
		putBuf(&at)
		if b := getBuf(); b == &at {
			return
		}
	}
	t.Fatalf("a buffer of exactly %d bytes was never reused", maxPooled)
}

// The budget docs/security.md states for the defaults is the bound the
// server's settings add up to, term by term: 64 MiB of unfinished
// requests, 16 MiB of held answers, 12,288 open calls of 14 KiB each
// (10 KiB of state and stack, a 4 KiB answer) and 1,024 connections of
// 232 KiB (96 KiB of buffers, two of 64 KiB unsent frames plus an answer).
// A change to either is a change to both.
func TestTheBudgetAtTheDefaultsIsTheOneDocumented(t *testing.T) {
	const KiB, MiB = 1 << 10, 1 << 20
	want := int64(64*MiB + 16*MiB + 12_288*14*KiB + 1_024*232*KiB)
	if got := new(Server).memoryBound(4 * KiB); got != want {
		t.Fatalf("the bound at the defaults: %d bytes (%.1f MiB), the docs say %d (%.1f MiB)", got, float64(got)/MiB, want, float64(want)/MiB)
	}
	// Each setting counts in it: one connection fewer, one open call fewer.
	fewer := &Server{MaxConnections: defaultMaxConnections - 1, MaxOpenCalls: defaultMaxOpenCalls - 1}
	if got := fewer.memoryBound(4 * KiB); got != want-(232*KiB+openCallsShare*14*KiB)-14*KiB {
		t.Fatalf("one connection and one call fewer: %d, want %d", got, want-(232*KiB+openCallsShare*14*KiB)-14*KiB)
	}
}
