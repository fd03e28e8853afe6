package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/valyala/fasthttp"

	"github.com/sluice-rl/sluice/httplimit"
)

// upstreamFailure is the one answer to an upstream that failed an
// exchange, on every plane and for upgrades too: 504 for an upstream that
// did not answer in time, 502 for one that could not be reached or
// answered what cannot be relayed. logged reports an unreachable upstream,
// which the plane logs (at most once a second).
func upstreamFailure(err error) (p *httplimit.Problem, logged bool) {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return badGateway(fmt.Sprintf("the upstream's answer is larger than the %d bytes read to settle its cost", httplimit.MaxSettleBody)), false
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrTLSHandshakeTimeout), errors.As(err, &ne) && ne.Timeout():
		return &httplimit.Problem{Type: "about:blank", Title: "Gateway Timeout", Status: http.StatusGatewayTimeout,
			Detail: "the upstream service did not answer in time"}, false
	case errors.Is(err, errWrongSwitch):
		return badGateway("the upstream switched to a protocol that was not asked for"), false
	}
	return badGateway("the upstream service did not answer"), true
}

// errWrongSwitch is an upstream that answered an upgrade with 101 to a
// protocol the client did not ask for.
var errWrongSwitch = errors.New("sluice: the upstream switched to a protocol that was not asked for")

func badGateway(detail string) *httplimit.Problem {
	return &httplimit.Problem{Type: "about:blank", Title: "Bad Gateway", Status: http.StatusBadGateway, Detail: detail}
}
