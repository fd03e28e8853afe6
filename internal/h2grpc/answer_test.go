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
