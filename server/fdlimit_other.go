//go:build !unix

package server

// fileLimit cannot be read on this system.
func fileLimit() int { return 0 }
