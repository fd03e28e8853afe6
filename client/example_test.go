package client_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/sluice-rl/sluice/client"
)

// A Transport retries a request the server refused for now (429, or 503
// with Retry-After), waiting as long as it asks, within a retry budget;
// it retries only what is safe to send twice.
func ExampleTransport() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "too many requests", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	defer srv.Close()

	c := &http.Client{Transport: &client.Transport{}}
	resp, err := c.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, calls.Load())
	// Output:
	// 200 2
}
