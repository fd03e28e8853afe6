// Command loopceiling answers every HTTP/1.1 request on an event loop per
// core (github.com/panjf2000/gnet) with the gateway's 429 for a limit of
// one an hour, fields and body, no decision made: how fast a refusal can
// go out on a machine at all, for bench/service/run.sh to put beside
// nginx's, HAProxy's, the bare fasthttp stack's (bareproxy) and the
// gateway's. It reads requests without bodies only (a request ends at its
// blank line), as wrk sends them; it is a measure, not a server.
//
//	loopceiling -listen 127.0.0.1:8002
package main

import (
	"bytes"
	"flag"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
)

var body = []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"Limit is 1 request per hour. Try again in about 60 minutes.","violated-policies":["strict"]}`)

var date atomic.Pointer[[]byte]

func refusal() []byte {
	var b []byte
	b = append(b, "HTTP/1.1 429 Too Many Requests\r\nServer: sluice\r\nDate: "...)
	b = append(b, *date.Load()...)
	b = append(b, "\r\nContent-Type: application/problem+json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\nRetry-After: 3600\r\nRatelimit-Policy: \"loose\";q=1000000000;w=1, \"strict\";q=1;w=3600\r\nRatelimit: \"strict\";r=0;t=3600\r\nCache-Control: no-store\r\n\r\n"...)
	return append(b, body...)
}

type server struct {
	gnet.BuiltinEventEngine
}

func (s *server) OnTraffic(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	n := 0
	var out []byte
	for {
		i := bytes.Index(buf[n:], []byte("\r\n\r\n"))
		if i < 0 {
			break
		}
		n += i + 4
		out = append(out, refusal()...)
	}
	c.Discard(n)
	if len(out) > 0 {
		c.Write(out)
	}
	return gnet.None
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8002", "listen address")
	flag.Parse()
	d := []byte(time.Now().UTC().Format(http.TimeFormat))
	date.Store(&d)
	go func() {
		for range time.Tick(time.Second) {
			d := []byte(time.Now().UTC().Format(http.TimeFormat))
			date.Store(&d)
		}
	}()
	log.Fatal(gnet.Run(&server{}, "tcp://"+*listen, gnet.WithMulticore(true)))
}
