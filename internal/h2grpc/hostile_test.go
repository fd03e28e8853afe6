package h2grpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/metadata"
)

// raw is an HTTP/2 client that writes frames as the test says, valid or not.
type raw struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *raw {
	t.Helper()
	r := dialPreface(t, addr)
	r.fr.WriteSettings(settings...)
	return r
}

// dialPreface connects and sends the client preface's magic string only,
// without the SETTINGS frame that ends it.
func dialPreface(t *testing.T, addr string) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	r := &raw{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.enc = hpack.NewEncoder(&r.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	return r
}

// call opens stream id with a gRPC call's headers (extra replace or add
// fields, name then value) and, if body is not nil, sends it and ends the
// stream.
func (r *raw) call(id uint32, path string, body []byte, extra ...string) {
	r.t.Helper()
	if err := r.send(id, path, body, extra...); err != nil {
		r.t.Fatal(err)
	}
}

// send is call for a client that stops at its first failed write: an
// attacker whose bytes the server no longer takes.
func (r *raw) send(id uint32, path string, body []byte, extra ...string) error {
	fields := map[string]string{":method": "POST", ":scheme": "http", ":authority": "x", ":path": path, "content-type": "application/grpc", "te": "trailers"}
	order := []string{":method", ":scheme", ":authority", ":path", "content-type", "te"}
	for i := 0; i < len(extra); i += 2 {
		if _, ok := fields[extra[i]]; !ok {
			order = append(order, extra[i])
		}
		fields[extra[i]] = extra[i+1]
	}
	r.hbuf.Reset()
	for _, k := range order {
		r.enc.WriteField(hpack.HeaderField{Name: k, Value: fields[k]})
	}
	block := r.hbuf.Bytes()
	n := min(len(block), 16384)
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:n], EndHeaders: n == len(block)}); err != nil {
		return err
	}
	for block = block[n:]; len(block) > 0; block = block[n:] {
		n = min(len(block), 16384)
		if err := r.fr.WriteContinuation(id, n == len(block), block[:n]); err != nil {
			return err
		}
	}
	if body != nil {
		return r.fr.WriteData(id, true, body)
	}
	return nil
}

// bigHeaders is n fields of size bytes each.
func bigHeaders(n, size int) []string {
	var kv []string
	for i := range n {
		kv = append(kv, "x-big-"+strings.Repeat("k", i+1), strings.Repeat("v", size))
	}
	return kv
}

func message(b []byte) []byte {
	return binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))) // the prefix
}

func framed(b []byte) []byte { return append(message(b), b...) }

// next reads frames until want says one is it; SETTINGS are acknowledged.
// It fails the test after 10 s or if the connection ends.
func (r *raw) next(want func(http2.Frame) bool) http2.Frame {
	r.t.Helper()
	r.nc.SetReadDeadline(time.Now().Add(patience))
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("reading frames: %v", err)
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			r.fr.WriteSettingsAck()
		}
		if want(f) {
			return f
		}
	}
}

// grpcStatus reads until stream id's trailers and returns grpc-status and
// grpc-message (or :status if there is no grpc-status).
func (r *raw) grpcStatus(id uint32) (string, string) {
	r.t.Helper()
	f := r.next(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == id && h.StreamEnded()
	}).(*http2.MetaHeadersFrame)
	if s := get(f, "grpc-status"); s != "" {
		return s, get(f, "grpc-message")
	}
	return ":status " + f.PseudoValue("status"), ""
}

func (r *raw) goAway() http2.ErrCode {
	r.t.Helper()
	f := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
	return f.(*http2.GoAwayFrame).ErrCode
}

func get(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// TestMalformedCallsAreAnswered: each malformed call gets the status grpc-go
// gives it, and the connection goes on serving.
func TestMalformedCallsAreAnswered(t *testing.T) {
	// Two streams at once at most: each malformed call, answered early,
	// must give its place back, or the good call at the end is refused.
	f := newFixture(t, func(s *Server) { s.MaxRecvMsgSize, s.MaxConcurrentStreams = 100, 2 })
	r := dialRaw(t, f.addr)
	compressed := framed([]byte("x"))
	compressed[0] = 1
	cases := []struct {
		body       []byte
		extra      []string
		code, text string
	}{
		{compressed, []string{"grpc-encoding", "gzip"}, "12", "compressed request messages are not supported"},
		{append(framed([]byte("a")), framed([]byte("b"))...), nil, "13", "more than one request message for a unary method"},
		{framed([]byte("abc"))[:6], nil, "13", "the request's message is cut short"},
		{[]byte{}, nil, "13", "the request has no complete message"},
		{append(message(make([]byte, 101)), 'x'), nil, "8", "request message larger than 100 bytes"},
		{framed(make([]byte, 100)), nil, "0", ""}, // the largest message taken
		{framed(nil), []string{":method", "GET"}, ":status 405", ""},
		{framed(nil), []string{"content-type", "text/plain"}, ":status 415", ""},
		{framed(nil), []string{"content-type", "application/grpcx"}, ":status 415", ""},
		{framed(nil), bigHeaders(16, 1<<10), "8", "header list larger than 16384 bytes"},
		{framed(nil), []string{":path", "/t.T/Missing"}, "12", "unknown method /t.T/Missing"},
	}
	id := uint32(1)
	for _, c := range cases {
		r.call(id, "/t.T/Echo", c.body, c.extra...)
		if code, text := r.grpcStatus(id); code != c.code || text != c.text {
			t.Errorf("stream %d (%v): got %s %q, want %s %q", id, c.extra, code, text, c.code, c.text)
		}
		id += 2
	}
	r.call(id, "/t.T/Echo", framed([]byte("still here")))
	if code, _ := r.grpcStatus(id); code != "0" {
		t.Fatalf("a good call after the malformed ones: grpc-status %s", code)
	}
}

// TestProtocolErrorsEndTheConnection: what RFC 9113 calls a connection error
// gets GOAWAY with its code.
func TestProtocolErrorsEndTheConnection(t *testing.T) {
	f := newFixture(t, nil)
	cases := map[string]struct {
		send func(r *raw)
		code http2.ErrCode
	}{
		"even stream id":         {func(r *raw) { r.call(2, "/t.T/Echo", framed(nil)) }, http2.ErrCodeProtocol},
		"stream id going back":   {func(r *raw) { r.call(5, "/t.T/Echo", framed(nil)); r.call(3, "/t.T/Echo", framed(nil)) }, http2.ErrCodeProtocol},
		"DATA on an idle stream": {func(r *raw) { r.fr.WriteData(7, true, framed(nil)) }, http2.ErrCodeProtocol},
		"a stream id used twice": {func(r *raw) {
			r.call(1, "/t.T/Echo", framed(nil))
			r.grpcStatus(1)
			r.call(1, "/t.T/Echo", nil) // HEADERS alone: nothing unread when the server closes
		}, http2.ErrCodeProtocol},
		"the id of a malformed HEADERS used again": {func(r *raw) {
			r.call(1, "/t.T/Echo", nil, "X-Upper", "v") // a stream error: the id is used all the same
			r.next(func(f http2.Frame) bool { rs, ok := f.(*http2.RSTStreamFrame); return ok && rs.StreamID == 1 })
			r.call(1, "/t.T/Echo", nil)
		}, http2.ErrCodeProtocol},
		"PUSH_PROMISE": {func(r *raw) {
			r.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
		}, http2.ErrCodeProtocol},
		"window overflow": {func(r *raw) {
			r.fr.WriteWindowUpdate(0, 1<<31-1)
			r.fr.WriteWindowUpdate(0, 1<<31-1)
		}, http2.ErrCodeFlowControl},
		"a header field beyond the header list limit": {func(r *raw) { r.call(1, "/t.T/Echo", framed(nil), "x-big", strings.Repeat("v", 17<<10)) }, http2.ErrCodeCompression},
		"frame too large": {func(r *raw) { r.fr.WriteData(1, false, make([]byte, 20000)) }, http2.ErrCodeFrameSize},
		"more than the connection window": {func(r *raw) {
			// Streams each within their limits, together beyond what the
			// connection may hold.
			chunk := make([]byte, 16000)
			for id := uint32(1); id < 2*(connWindow/(1<<20)+2); id += 2 {
				r.call(id, "/t.T/Echo", nil)
				r.fr.WriteData(id, false, message(make([]byte, 1<<20-16)))
				for range (1<<20 - 32) / len(chunk) {
					if r.fr.WriteData(id, false, chunk) != nil {
						return
					}
				}
			}
		}, http2.ErrCodeFlowControl},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := dialRaw(t, f.addr)
			c.send(r)
			if got := r.goAway(); got != c.code {
				t.Fatalf("GOAWAY %v, want %v", got, c.code)
			}
		})
	}
	t.Run("no SETTINGS first", func(t *testing.T) {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, http2.ClientPreface)
		r := &raw{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		r.fr.WritePing(false, [8]byte{})
		if got := r.goAway(); got != http2.ErrCodeProtocol {
			t.Fatalf("GOAWAY %v, want PROTOCOL_ERROR", got)
		}
	})
	t.Run("not HTTP/2", func(t *testing.T) {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		nc.SetReadDeadline(time.Now().Add(patience))
		if n, err := io.ReadAll(nc); !errors.Is(err, nil) || len(n) > 0 && !bytes.HasPrefix(n, []byte{0, 0}) {
			t.Fatalf("an HTTP/1.1 request got %q, %v; want the connection closed", n, err)
		}
	})
}

// TestStreamLimitHoldsUnderResets: streams beyond MaxConcurrentStreams are
// refused, and resetting calls does not let more methods run at once than
// the limit, however many are opened and reset.
func TestStreamLimitHoldsUnderResets(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxConcurrentStreams = 4 })
	r := dialRaw(t, f.addr)
	refused := 0
	for i := range 200 {
		id := uint32(2*i + 1)
		r.call(id, "/t.T/Hold", framed(nil))
		r.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	// A PING's answer comes after everything before it was read.
	r.fr.WritePing(false, [8]byte{1})
	r.next(func(f http2.Frame) bool {
		if s, ok := f.(*http2.RSTStreamFrame); ok && s.ErrCode == http2.ErrCodeRefusedStream {
			refused++
		}
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck()
	})
	if got := f.maxRun.Load(); got > 4 || got == 0 {
		t.Fatalf("%d methods ran at once, limit 4", got)
	}
	if refused < 190 {
		t.Fatalf("%d of 200 streams refused with 4 methods held", refused)
	}
	close(f.release)
	// Once the held methods return, the connection serves again.
	deadline := time.Now().Add(patience)
	for id := uint32(1001); ; id += 2 {
		r.call(id, "/t.T/Echo", framed([]byte("after")))
		f := r.next(func(f http2.Frame) bool {
			if s, ok := f.(*http2.RSTStreamFrame); ok && s.StreamID == id {
				return true
			}
			h, ok := f.(*http2.MetaHeadersFrame)
			return ok && h.StreamID == id && h.StreamEnded()
		})
		if h, ok := f.(*http2.MetaHeadersFrame); ok && get(h, "grpc-status") == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no call served after the held methods returned")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSendWindowIsRespected: a client that allows 10 bytes per stream gets
// 10 bytes, then the rest only as it grants more.
func TestSendWindowIsRespected(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	body := bytes.Repeat([]byte("0123456789"), 10)
	r.call(1, "/t.T/Echo", framed(body))
	var got []byte
	granted := 10
	for len(got) < len(body)+5 {
		fr := r.next(func(f http2.Frame) bool {
			d, ok := f.(*http2.DataFrame)
			return ok && d.StreamID == 1
		}).(*http2.DataFrame)
		got = append(got, fr.Data()...)
		if len(got) > granted {
			t.Fatalf("%d bytes sent with %d granted", len(got), granted)
		}
		if len(got) == granted {
			// Nothing more comes until the client grants it: a PING is
			// answered before any DATA.
			r.fr.WritePing(false, [8]byte{2})
			r.next(func(f http2.Frame) bool {
				if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
					t.Fatalf("DATA beyond the window")
				}
				p, ok := f.(*http2.PingFrame)
				return ok && p.IsAck()
			})
			r.fr.WriteWindowUpdate(1, 30)
			granted += 30
		}
	}
	if !bytes.Equal(got, framed(body)) {
		t.Fatalf("the answer arrived as %q", got)
	}
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("grpc-status %s", code)
	}
}

// A stream reset while its answer waits for the client's window gives its
// place back: with one stream allowed, the next call on the connection is
// served, not refused (and the connection can idle out and shut down).
func TestAResetStreamWaitingForWindowFreesItsPlace(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxConcurrentStreams = 1 })
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.call(1, "/t.T/Echo", framed([]byte("held by a window of 0")))
	// The answer's headers go out; its message waits for window.
	r.next(func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 1
	})
	r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	r.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 65535})
	r.call(3, "/t.T/Echo", framed([]byte("next")))
	end := r.next(func(f http2.Frame) bool {
		if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.StreamID == 3 {
			return true
		}
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.StreamEnded()
	})
	if h, ok := end.(*http2.MetaHeadersFrame); !ok || get(h, "grpc-status") != "0" {
		t.Fatalf("the call after a reset held answer ended with %v, want grpc-status 0 (its place was not given back)", end)
	}
}

// TestPingIsAnswered: PING is acknowledged with its data.
func TestPingIsAnswered(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	r.fr.WritePing(false, [8]byte{'s', 'l', 'u', 'i', 'c', 'e'})
	p := r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() }).(*http2.PingFrame)
	if string(p.Data[:6]) != "sluice" {
		t.Fatalf("PING answered with %q", p.Data)
	}
}

// A shutdown that comes after the server's SETTINGS is written but before
// the client's SETTINGS is read still drains in two phases: the client may
// have read the server's SETTINGS and be sending a call. (It used to close
// such a connection at once, resetting a client that had done nothing
// wrong; a contract test saw it as "connection reset by peer".)
func TestShutdownBeforeTheClientsSettingsDrains(t *testing.T) {
	f := newFixture(t, nil)
	// The preface alone: the server waits for the SETTINGS that ends it.
	r := dialPreface(t, f.addr)
	nc := r.nc
	nc.SetReadDeadline(time.Now().Add(patience))
	if f, err := r.fr.ReadFrame(); err != nil {
		t.Fatal(err)
	} else if _, ok := f.(*http2.SettingsFrame); !ok {
		t.Fatalf("the server's first frame is %v, want SETTINGS", f)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
		defer cancel()
		shut <- f.s.Shutdown(ctx)
	}()
	first := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if first.LastStreamID != 1<<31-1 {
		t.Fatalf("first GOAWAY names stream %d, want the largest", first.LastStreamID)
	}
	ping := r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() }).(*http2.PingFrame)
	r.fr.WriteSettings()
	r.fr.WriteSettingsAck()
	r.call(1, "/t.T/Echo", framed([]byte("in time")))
	r.fr.WritePing(true, ping.Data)
	// The answer and the second GOAWAY, in either order.
	status, last := "", uint32(0)
	for status == "" || last == 0 {
		switch f := r.next(func(http2.Frame) bool { return true }).(type) {
		case *http2.MetaHeadersFrame:
			if v := get(f, "grpc-status"); v != "" && f.StreamID == 1 {
				status = v
			}
		case *http2.RSTStreamFrame:
			t.Fatalf("the call sent between the phases was reset: %v", f.ErrCode)
		case *http2.GoAwayFrame:
			if last = f.LastStreamID; last != 1 {
				t.Fatalf("second GOAWAY names stream %d, want 1", last)
			}
		}
	}
	if status != "0" {
		t.Fatalf("the call sent between the phases: grpc-status %s", status)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Clients stuck in their handshake (nothing sent; the preface alone; half a
// SETTINGS frame) do not hold Shutdown for the handshake timeout (10 s):
// they have no call to finish.
func TestShutdownDoesNotWaitForStalledHandshakes(t *testing.T) {
	f := newFixture(t, nil)
	for i := range 9 {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		switch i % 3 {
		case 1:
			io.WriteString(nc, http2.ClientPreface)
		case 2:
			io.WriteString(nc, http2.ClientPreface+"\x00\x00")
		}
	}
	cc := f.client(t)
	if _, err := invoke(context.Background(), cc, "/t.T/Echo", []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the stalled ones accepted and read
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	if err := f.s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with stalled handshakes: %v (waited for them)", err)
	}
}

// TestFlowControlEdges: the server announces a stream window of a largest
// message, its prefix and a frame, and opens the connection window to
// connWindow; a client may open the send window to exactly 2^31-1.
func TestFlowControlEdges(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	sf := r.next(func(f http2.Frame) bool { s, ok := f.(*http2.SettingsFrame); return ok && !s.IsAck() }).(*http2.SettingsFrame)
	if v, ok := sf.Value(http2.SettingInitialWindowSize); !ok || int64(v) != int64(f.s.maxRecv())+5+16<<10 {
		t.Fatalf("INITIAL_WINDOW_SIZE %d (%v), want the largest message, its prefix and a frame: %d", v, ok, f.s.maxRecv()+5+16<<10)
	}
	wu := r.next(func(f http2.Frame) bool { w, ok := f.(*http2.WindowUpdateFrame); return ok && w.StreamID == 0 }).(*http2.WindowUpdateFrame)
	if wu.Increment != connWindow-65535 {
		t.Fatalf("the connection's WINDOW_UPDATE: %d, want %d", wu.Increment, connWindow-65535)
	}
	r.fr.WriteWindowUpdate(0, 1<<31-1-65535) // the send window at exactly 2^31-1: allowed
	r.call(1, "/t.T/Echo", framed([]byte("ok")))
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("a call after the send window was opened to 2^31-1: grpc-status %s", code)
	}
}

// TestMetadataReachesTheMethod: the header fields named in KeepHeaders are
// the call's incoming metadata; the others are not kept.
func TestMetadataReachesTheMethod(t *testing.T) {
	f := newFixture(t, func(s *Server) {
		s.KeepHeaders = []string{"x-meta"}
		s.Methods["/t.T/Meta"] = func(ctx context.Context, _, out []byte) ([]byte, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			return append(out, strings.Join(append(md.Get("x-meta"), md.Get("x-other")...), ",")...), nil
		}
	})
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-meta", "hello", "x-other", "dropped")
	got, err := invoke(ctx, f.client(t), "/t.T/Meta", nil)
	if err != nil || string(got) != "hello" {
		t.Fatalf("the method saw %q (%v), want x-meta's hello only", got, err)
	}
}

// TestConnectionAgeIsJittered: a connection is recycled after its age give
// or take 10%, spread over the whole range.
func TestConnectionAgeIsJittered(t *testing.T) {
	age := 30 * time.Minute
	lo, hi := age, age
	for range 1000 {
		j := jittered(age)
		if j < age-age/10 || j > age+age/10 {
			t.Fatalf("jittered(%v) = %v, beyond 10%%", age, j)
		}
		lo, hi = min(lo, j), max(hi, j)
	}
	if lo > age-age/20 || hi < age+age/20 { // missed with a chance of 0.75^1000 < 10^-100
		t.Fatalf("1000 draws spread over [%v, %v], want both sides of %v past 5%%", lo, hi, age)
	}
}

// TestEmptyDataFloodIsCut: DATA frames that carry nothing and end nothing
// are idle frames; past maxIdleFrames with no answer in between, the
// connection is ended with ENHANCE_YOUR_CALM at the next check.
func TestEmptyDataFloodIsCut(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	r.call(1, "/t.T/Echo", nil) // open: the request's DATA never comes
	for range maxIdleFrames + 10 {
		if r.fr.WriteData(1, false, nil) != nil {
			break
		}
	}
	if got := r.goAway(); got != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v after an empty DATA flood, want ENHANCE_YOUR_CALM", got)
	}
}

// TestPingStrikes: a client PING sooner than MinPingInterval after the
// previous, with nothing sent between, is a strike; maxPingStrikes are
// tolerated, the next ends the connection "too_many_pings".
func TestPingStrikes(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	ping := func() {
		r.fr.WritePing(false, [8]byte{'p'})
		r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	}
	for range 1 + maxPingStrikes { // the first is no strike
		ping()
	}
	r.call(1, "/t.T/Echo", framed([]byte("still")))
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("a call after %d strikes: grpc-status %s", maxPingStrikes, code)
	}
	// The call's HEADERS reset the count: the strikes start over.
	for range 1 + maxPingStrikes {
		ping()
	}
	r.fr.WritePing(false, [8]byte{'p'})
	f2 := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if f2.ErrCode != http2.ErrCodeEnhanceYourCalm || string(f2.DebugData()) != "too_many_pings" {
		t.Fatalf("GOAWAY %v %q after %d strikes, want ENHANCE_YOUR_CALM too_many_pings", f2.ErrCode, f2.DebugData(), maxPingStrikes+1)
	}
}

// TestKeepalive: a connection quiet for KeepaliveTime gets a PING; its
// acknowledgement keeps the connection serving (it is not the drain's).
func TestKeepalive(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.KeepaliveTime = time.Millisecond })
	r := dialRaw(t, f.addr)
	p := r.next(func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() }).(*http2.PingFrame)
	r.fr.WritePing(true, p.Data)
	time.Sleep(10 * time.Millisecond)
	r.call(1, "/t.T/Echo", framed([]byte("alive")))
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("a call after a keepalive PING was acknowledged: grpc-status %s", code)
	}
}

// TestStreamWindowEdges: a stream's send window may be opened to exactly
// 2^31-1, one more is a stream error; a stream answered early (an unknown
// method) reads its request to the end of its window, exactly.
func TestStreamWindowEdges(t *testing.T) {
	f := newFixture(t, func(s *Server) { s.MaxRecvMsgSize = 100 })
	r := dialRaw(t, f.addr)
	r.call(1, "/t.T/Echo", nil) // open, its request not sent yet
	r.fr.WriteWindowUpdate(1, 1<<31-1-65535)
	r.fr.WriteData(1, true, framed([]byte("x")))
	if code, _ := r.grpcStatus(1); code != "0" {
		t.Fatalf("a call whose stream window was opened to exactly 2^31-1: grpc-status %s", code)
	}
	r.call(5, "/t.T/Echo", nil)
	r.fr.WriteWindowUpdate(5, 1<<31-1-65535)
	r.fr.WriteWindowUpdate(5, 1)
	rs := r.next(func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if rs.StreamID != 5 || rs.ErrCode != http2.ErrCodeFlowControl {
		t.Fatalf("a stream window past 2^31-1: RST_STREAM %d %v, want 5 FLOW_CONTROL", rs.StreamID, rs.ErrCode)
	}
	window := f.s.maxRecv() + 5 + 16<<10
	r.call(7, "/t.T/Missing", nil)
	r.fr.WriteData(7, false, make([]byte, 16<<10))
	r.fr.WriteData(7, true, make([]byte, window-16<<10))
	if code, _ := r.grpcStatus(7); code != "12" {
		t.Fatalf("an unknown method's request of exactly the stream window: grpc-status %s, want 12", code)
	}
}

// TestConnectionWindowIsCreditedInEighths: request bytes are given back to
// the connection window once they add up to an eighth of it, exactly.
func TestConnectionWindowIsCreditedInEighths(t *testing.T) {
	f := newFixture(t, nil)
	r := dialRaw(t, f.addr)
	r.next(func(f http2.Frame) bool { w, ok := f.(*http2.WindowUpdateFrame); return ok && w.StreamID == 0 }) // the opening one
	body := framed(make([]byte, connWindow/8-5))
	r.call(1, "/t.T/Echo", nil)
	for len(body) > 0 {
		n := min(len(body), 16<<10)
		r.fr.WriteData(1, n == len(body), body[:n])
		body = body[n:]
	}
	wu := r.next(func(f http2.Frame) bool { w, ok := f.(*http2.WindowUpdateFrame); return ok && w.StreamID == 0 }).(*http2.WindowUpdateFrame)
	if wu.Increment != connWindow/8 {
		t.Fatalf("the connection window credited %d, want an eighth of it, %d", wu.Increment, connWindow/8)
	}
}
