package h2grpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzConnection writes arbitrary bytes after a client's preface and
// SETTINGS: whatever they are, the connection must neither panic nor hang.
// The seeds are a valid call, a reset call, and frames that break the rules.
func FuzzConnection(f *testing.F) {
	frames := func(write func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer)) []byte {
		var b bytes.Buffer
		var hbuf bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		write(fr, hpack.NewEncoder(&hbuf), &hbuf)
		return b.Bytes()
	}
	headers := func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer, id uint32, path string) {
		hbuf.Reset()
		for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "x"}, {"content-type", "application/grpc"}} {
			enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true})
	}
	f.Add(frames(func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer) {
		headers(fr, enc, hbuf, 1, "/t.T/Echo")
		fr.WriteData(1, true, framed([]byte("hello")))
	}))
	f.Add(frames(func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer) {
		headers(fr, enc, hbuf, 1, "/t.T/Echo")
		fr.WriteRSTStream(1, http2.ErrCodeCancel)
		fr.WriteData(1, true, framed(nil))
		fr.WriteWindowUpdate(1, 1)
		headers(fr, enc, hbuf, 3, "/t.T/Big")
		fr.WriteData(3, false, message([]byte("x")))
		fr.WriteData(3, true, []byte("x"))
	}))
	f.Add(frames(func(fr *http2.Framer, enc *hpack.Encoder, hbuf *bytes.Buffer) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
		headers(fr, enc, hbuf, 5, "/t.T/Echo")
		fr.WriteContinuation(5, true, []byte{0x82})
		fr.WritePing(false, [8]byte{})
		fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	}))
	f.Add([]byte{0, 0, 0, 9, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var mu sync.Mutex
		var panics []string
		s := &Server{
			Methods: map[string]Method{
				"/t.T/Echo": func(_ context.Context, req, out []byte) ([]byte, error) { return append(out, req...), nil },
				"/t.T/Big": func(_ context.Context, req, out []byte) ([]byte, error) {
					return append(out, make([]byte, 100_000)...), nil
				},
			},
			OnPanic: func(m string, v any) {
				mu.Lock()
				defer mu.Unlock()
				panics = append(panics, fmt.Sprint(m, ": ", v))
			},
		}
		s.startWorkers()
		defer s.Close()
		client, server := net.Pipe()
		c := newConn(s, server)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go io.Copy(io.Discard, client) // never block the server's writes
		client.SetWriteDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(client, http2.ClientPreface)
		http2.NewFramer(client, nil).WriteSettings()
		client.Write(data)
		client.Close()
		select {
		case <-done:
		case <-time.After(patience):
			t.Fatal("the connection did not end after its client closed")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(panics) > 0 {
			t.Fatalf("panics: %v", panics)
		}
	})
}
