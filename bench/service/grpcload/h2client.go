package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2client makes unary gRPC calls over one HTTP/2 connection, as Envoy's
// C++ client does: many concurrent streams, frames written straight to the
// socket. It exists because grpc-go's client spends about as much CPU per
// call as the services it measures, and on a two-core machine what the load
// generator spends is taken from the service; a C++ Envoy spends far less.
// It checks what it needs to: :status, grpc-status, the message.
type h2client struct {
	nc    net.Conn
	fr    *http2.Framer
	out   outBuffer // frames not yet written
	spare []byte

	wmu      sync.Mutex
	wcond    sync.Cond
	pending  atomic.Int32
	flushing bool
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	nextID   uint32
	sendConn int64 // the server's connection window for our requests
	peerInit int64 // the server's window for each new stream
	streams  map[uint32]*call
	inFlight int
	maxConc  int
	broken   error

	recvUnacked int64 // response bytes to credit back (reader only)
}

type call struct {
	sendWindow int64 // under wmu
	status     string
	grpcStatus string
	body       []byte
	done       chan struct{}
}

func dialH2(addr string) (*h2client, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2client{nc: nc, nextID: 1, sendConn: 65535, peerInit: 65535, streams: map[uint32]*call{}, maxConc: 100}
	c.wcond.L = &c.wmu
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.fr = http2.NewFramer(&c.out, bufio.NewReaderSize(nc, 64<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.out.b = append(c.out.b, http2.ClientPreface...)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	c.fr.WriteWindowUpdate(0, 1<<24)
	if _, err := nc.Write(c.out.b); err != nil {
		return nil, err
	}
	c.out.b = c.out.b[:0]
	go c.read()
	return c, nil
}

// do calls path with the framed message msg and returns the answer's
// message, or an error naming a non-OK status.
func (c *h2client) do(path string, msg []byte) ([]byte, error) {
	cl := &call{done: make(chan struct{})}
	c.pending.Add(1)
	c.wmu.Lock()
	for c.inFlight >= c.maxConc && c.broken == nil {
		c.pending.Add(-1)
		c.wcond.Wait()
		c.pending.Add(1)
	}
	if c.broken != nil {
		err := c.broken
		c.release()
		return nil, err
	}
	id := c.nextID
	c.nextID += 2
	c.inFlight++
	cl.sendWindow = c.peerInit
	c.streams[id] = cl
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "ratelimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	for len(msg) > 0 {
		for c.broken == nil && min(c.sendConn, cl.sendWindow) <= 0 {
			c.flush()
			c.pending.Add(-1)
			c.wcond.Wait()
			c.pending.Add(1)
		}
		if c.broken != nil {
			break
		}
		n := min(int64(len(msg)), c.sendConn, cl.sendWindow, 16384)
		c.fr.WriteData(id, n == int64(len(msg)), msg[:n])
		c.sendConn -= n
		cl.sendWindow -= n
		msg = msg[n:]
	}
	c.release()
	<-cl.done
	switch {
	case cl.status != "200":
		return nil, fmt.Errorf("HTTP status %q", cl.status)
	case cl.grpcStatus != "0":
		return nil, fmt.Errorf("grpc-status %q", cl.grpcStatus)
	case len(cl.body) < 5 || int(binary.BigEndian.Uint32(cl.body[1:5])) != len(cl.body)-5:
		return nil, errors.New("a malformed answer")
	}
	return cl.body[5:], nil
}

// release leaves the writer; the last one out writes what is buffered.
func (c *h2client) release() {
	if c.pending.Add(-1) == 0 {
		c.flush()
	}
	c.wmu.Unlock()
}

func (c *h2client) flush() {
	if c.flushing || len(c.out.b) == 0 || c.broken != nil {
		return
	}
	c.flushing = true
	for len(c.out.b) > 0 && c.broken == nil {
		b := c.out.b
		c.out.b = c.spare[:0]
		c.wmu.Unlock()
		_, err := c.nc.Write(b)
		c.wmu.Lock()
		c.spare = b
		if err != nil {
			c.fail(err)
		}
	}
	c.flushing = false
}

// fail ends every call; under wmu.
func (c *h2client) fail(err error) {
	if c.broken != nil {
		return
	}
	c.broken = err
	for id, cl := range c.streams {
		cl.status = "connection lost: " + err.Error()
		close(cl.done)
		delete(c.streams, id)
	}
	c.wcond.Broadcast()
}

func (c *h2client) read() {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.wmu.Lock()
			c.fail(err)
			c.wmu.Unlock()
			return
		}
		c.pending.Add(1)
		c.wmu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				f.ForeachSetting(func(s http2.Setting) error {
					switch s.ID {
					case http2.SettingInitialWindowSize:
						c.peerInit = int64(s.Val)
					case http2.SettingMaxConcurrentStreams:
						c.maxConc = int(min(s.Val, 1<<20))
					}
					return nil
				})
				c.fr.WriteSettingsAck()
				c.wcond.Broadcast()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.fr.WritePing(true, f.Data)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.sendConn += int64(f.Increment)
			} else if cl := c.streams[f.StreamID]; cl != nil {
				cl.sendWindow += int64(f.Increment)
			}
			c.wcond.Broadcast()
		case *http2.MetaHeadersFrame:
			if cl := c.streams[f.StreamID]; cl != nil {
				for _, hf := range f.Fields {
					switch hf.Name {
					case ":status":
						cl.status = hf.Value
					case "grpc-status":
						cl.grpcStatus = hf.Value
					}
				}
				if f.StreamEnded() {
					c.finish(f.StreamID, cl)
				}
			}
		case *http2.DataFrame:
			c.recvUnacked += int64(f.Length)
			if c.recvUnacked > 1<<22 {
				c.fr.WriteWindowUpdate(0, uint32(c.recvUnacked))
				c.recvUnacked = 0
			}
			if cl := c.streams[f.StreamID]; cl != nil {
				cl.body = append(cl.body, f.Data()...)
				if f.StreamEnded() {
					c.finish(f.StreamID, cl)
				}
			}
		case *http2.RSTStreamFrame:
			if cl := c.streams[f.StreamID]; cl != nil {
				cl.status = "reset: " + f.ErrCode.String()
				c.finish(f.StreamID, cl)
			}
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("GOAWAY %v", f.ErrCode))
		}
		c.release()
	}
}

// finish hands a call its answer; under wmu.
func (c *h2client) finish(id uint32, cl *call) {
	delete(c.streams, id)
	c.inFlight--
	close(cl.done)
	c.wcond.Broadcast()
}

func (c *h2client) Close() error { return c.nc.Close() }

// frame prefixes a message as gRPC does.
func frame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...)
}

// outBuffer collects the framer's writes.
type outBuffer struct{ b []byte }

func (o *outBuffer) Write(p []byte) (int, error) {
	o.b = append(o.b, p...)
	return len(p), nil
}
