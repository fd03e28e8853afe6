package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
)

// Finish completes a check once its response is known: it charges the
// countOn rules for the response's status and settles the reservations
// from its header (header looks one up) or its JSON body. The middleware
// calls it after the handler, the gateway after the upstream's answer;
// both count even if the client has gone.
func Finish(ctx context.Context, e *engine.Engine, res *engine.Result, status int, header func(string) string, body []byte) {
	ctx = context.WithoutCancel(ctx)
	if res.Charges() {
		e.Charge(ctx, res, status)
	}
	if res.Settles() {
		e.SettleResult(ctx, res, func(rv *rules.Reserve) (int64, bool) { return ActualFrom(rv, header, body) })
	}
}

// MaxSettleBody bounds the response body read for a reserve rule's
// actualJSON: the first MaxSettleBody bytes are parsed, and a longer body
// settles at the estimate.
const MaxSettleBody = 8 << 20

// ActualFrom reads a reserve rule's real cost from a response: the header
// rv.ActualHeader (header looks it up), or the JSON field rv.ActualJSON of
// body. It reports false when the response does not say (no such header or
// field, not a whole number >= 0, a body cut at MaxSettleBody): the
// reservation then settles at its estimate.
func ActualFrom(rv *rules.Reserve, header func(string) string, body []byte) (int64, bool) {
	switch {
	case rv.ActualHeader != "":
		return wholeNumber(strings.TrimSpace(header(rv.ActualHeader)))
	case rv.ActualJSON != nil:
		return jsonNumber(body, rv.ActualJSON)
	}
	return 0, false
}

func wholeNumber(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0
}

// jsonNumber finds the number at path in a JSON document.
func jsonNumber(body []byte, path []string) (int64, bool) {
	if len(body) == 0 || len(body) > MaxSettleBody {
		return 0, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return 0, false
	}
	for _, field := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return 0, false
		}
		if v, ok = obj[field]; !ok {
			return 0, false
		}
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	return wholeNumber(n.String())
}
