// Command loopceiling answers every HTTP/1.1 request with the gateway's
// 429 for a limit of one an hour, fields and body, no decision made and
// nothing parsed beyond the blank line that ends a request: how fast a
// refusal can go out on a machine at all, for bench/service/run.sh to put
// beside nginx's, HAProxy's, the bare fasthttp stack's (bareproxy) and the
// gateway's. Two ways, one a process:
//
//   - -mode loop (the default): an event loop per core on its own epoll
//     (github.com/panjf2000/gnet), as nginx and HAProxy are built: a
//     connection is read when the kernel says it has bytes, once.
//   - -mode goroutine: a goroutine per connection on Go's own network
//     poller, as every Go HTTP server is built (net/http, fasthttp, and so
//     the gateway's two planes): a read that finds no bytes parks the
//     goroutine until the poller wakes it, so each request costs a read
//     that comes back empty and the wake-up besides. Four Go processors a
//     CPU, as the gateway runs, unless GOMAXPROCS is set.
//   - -mode decide: the event loop, each request parsed and decided as the
//     gateway does it and its refusal rendered as the gateway renders it
//     (decide.go): what a plane of the gateway's own on an event loop could
//     do at most on the refusal path.
//
// It reads requests without bodies only, as wrk sends them; it is a
// measure, not a server.
//
//	loopceiling -listen 127.0.0.1:8002 [-mode goroutine | -mode decide -config gw.yaml]
package main

import (
	"bytes"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

var body = []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"Limit is 1 request per hour. Try again in about 60 minutes.","violated-policies":["strict"]}`)

// response is the refusal's bytes, rebuilt each second for its Date field,
// and date that field's value, for -mode decide.
var (
	response atomic.Pointer[[]byte]
	date     atomic.Pointer[[]byte]
)

func refusal(now time.Time) []byte {
	var b []byte
	b = append(b, "HTTP/1.1 429 Too Many Requests\r\nServer: sluice\r\nDate: "...)
	b = now.UTC().AppendFormat(b, http.TimeFormat)
	b = append(b, "\r\nContent-Type: application/problem+json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\nRetry-After: 3600\r\nRatelimit-Policy: \"loose\";q=1000000000;w=1, \"strict\";q=1;w=3600\r\nRatelimit: \"strict\";r=0;t=3600\r\nCache-Control: no-store\r\n\r\n"...)
	return append(b, body...)
}

type server struct {
	gnet.BuiltinEventEngine
}

// answer appends a refusal to dst for each whole request at the start of
// in, and says how many bytes of in they took.
func answer(dst, in []byte) ([]byte, int) {
	n, _ := eachHead(in, func([]byte) bool {
		dst = append(dst, *response.Load()...)
		return true
	})
	return dst, n
}

// eachHead calls f with each whole request head at the start of in, its
// blank line included, and returns how many bytes the heads took; it stops
// at the first head f refuses, with ok false.
func eachHead(in []byte, f func(head []byte) bool) (n int, ok bool) {
	for {
		i := bytes.Index(in[n:], []byte("\r\n\r\n"))
		if i < 0 {
			return n, true
		}
		if !f(in[n : n+i+4]) {
			return n, false
		}
		n += i + 4
	}
}

// reply takes the n bytes its answers took from c's input and writes out.
func reply(c gnet.Conn, n int, out []byte) {
	if n > 0 { // gnet's Discard(0) empties the whole buffer: a request split across reads would be lost
		c.Discard(n)
	}
	if len(out) > 0 {
		c.Write(out)
	}
}

func (s *server) OnTraffic(c gnet.Conn) gnet.Action {
	out, _ := c.Context().(*[]byte) // the connection's, reused
	if out == nil {
		out = new([]byte)
		c.SetContext(out)
	}
	in, _ := c.Peek(-1)
	var n int
	*out, n = answer((*out)[:0], in)
	reply(c, n, *out)
	return gnet.None
}

// serveConn answers conn's requests on its own goroutine, blocking reads
// and writes through Go's network poller.
func serveConn(conn net.Conn) {
	defer conn.Close()
	in := make([]byte, 16<<10)
	var out []byte
	have := 0
	for {
		n, err := conn.Read(in[have:])
		if err != nil {
			return
		}
		var done int
		out, done = answer(out[:0], in[:have+n])
		have = copy(in, in[done:have+n])
		if have == len(in) {
			return // a header past 16 KiB: not a request this measure reads
		}
		if len(out) > 0 {
			if _, err := conn.Write(out); err != nil {
				return
			}
		}
	}
}

func serveGoroutines(listen string) error {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(4 * runtime.GOMAXPROCS(0))
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(conn)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8002", "listen address")
	mode := flag.String("mode", "loop", "loop (an event loop per core, gnet), goroutine (a goroutine per connection, Go's network poller) or decide (loop, each request parsed and decided as the gateway does)")
	config := flag.String("config", "", "with -mode decide: the gateway's rule file")
	flag.Parse()
	stamp := func(now time.Time) {
		r, d := refusal(now), now.UTC().AppendFormat(nil, http.TimeFormat)
		response.Store(&r)
		date.Store(&d)
	}
	stamp(time.Now())
	go func() {
		for now := range time.Tick(time.Second) {
			stamp(now)
		}
	}()
	switch *mode {
	case "loop":
		log.Fatal(gnet.Run(&server{}, "tcp://"+*listen, gnet.WithMulticore(true)))
	case "goroutine":
		log.Fatal(serveGoroutines(*listen))
	case "decide":
		d, err := newDecider(*config)
		if err != nil {
			log.Fatal(err)
		}
		log.Fatal(gnet.Run(d, "tcp://"+*listen, gnet.WithMulticore(true)))
	default:
		log.Fatalf("loopceiling: -mode %q: want loop, goroutine or decide", *mode)
	}
}
