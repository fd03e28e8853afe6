//go:build !unix

package gateway

// fileLimit cannot be read on this system.
func fileLimit() int { return 0 }
