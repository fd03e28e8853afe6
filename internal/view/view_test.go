package view

import "testing"

// A view shares its bytes: it reads what they are now, and an empty slice
// (nil or not) is the empty string.
func TestStringSharesTheBytes(t *testing.T) {
	b := []byte("user-1")
	s := String(b)
	if s != "user-1" {
		t.Fatalf("%q", s)
	}
	b[5] = '2'
	if s != "user-2" {
		t.Fatalf("the view did not follow its bytes: %q", s)
	}
	if String(nil) != "" || String(b[:0]) != "" {
		t.Fatal("an empty slice is not the empty string")
	}
}
