//go:build !unix

package gateway

import "net"

// peerClosed cannot look at a socket without reading it on this system: a
// held request's client is taken to be there until the hold ends.
func peerClosed(net.Conn) bool { return false }

// upstreamGone cannot look at a socket without reading it on this system:
// a closed idle upstream connection is found when a request on it fails.
func upstreamGone(net.Conn) bool { return false }
