package grpclimit

import (
	"net/http"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
)

// refusal is the status of a refused result, by the HTTP status the
// faces answer for it: 429 ResourceExhausted, 503 Unavailable, a request
// that cannot be counted InvalidArgument. A wait is RetryInfo; the rules
// that refused are QuotaFailure's subjects.
func refusal(res *engine.Result) error {
	p := httplimit.ProblemFor(res)
	code := codes.ResourceExhausted
	switch p.Status {
	case http.StatusServiceUnavailable:
		code = codes.Unavailable
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return status.New(codes.InvalidArgument, p.Detail).Err()
	}
	var q *errdetails.QuotaFailure
	if res.Reason != sluice.ReasonBadRequest {
		q = &errdetails.QuotaFailure{}
		for _, rule := range p.ViolatedPolicies {
			q.Violations = append(q.Violations, &errdetails.QuotaFailure_Violation{Subject: "rule:" + rule, Description: p.Detail})
		}
	}
	return withRetry(status.New(code, p.Detail), res.Decision.RetryAfter, q).Err()
}

// withRetry adds RetryInfo (when there is a wait) and q to s.
func withRetry(s *status.Status, wait time.Duration, q *errdetails.QuotaFailure) *status.Status {
	var details []protoadapt.MessageV1
	if wait > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	}
	if q != nil && len(q.Violations) > 0 {
		details = append(details, q)
	}
	if len(details) == 0 {
		return s
	}
	if d, err := s.WithDetails(details...); err == nil {
		return d
	}
	return s
}

// httpStatus reads a call's code as the HTTP status that means the same
// (the gRPC-HTTP mapping): for countOn rules and the service's pressure.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
