package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// runProbe asks a running sluice for /healthz or /readyz and exits 0 when
// it answers 2xx: a health check for containers without curl, and for a
// sidecar listening on loopback only, which a kubelet's httpGet probe (sent
// to the pod's address) cannot reach.
func runProbe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	ca := fs.String("ca", "", "trust the certificate authorities in this PEM `FILE` for an https URL (such as the self-signed certificate of --tls-cert), besides the system's")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: sluice probe URL [--timeout 2s] [--ca FILE]")
		fmt.Fprintln(stderr, "\nGETs URL (a sluice /healthz or /readyz) and exits 0 on a 2xx answer, 1")
		fmt.Fprintln(stderr, "otherwise, printing the answer.")
		fmt.Fprintln(stderr, "\nExample:\n  sluice probe http://127.0.0.1:8080/readyz")
		fmt.Fprintln(stderr, "\nFlags:")
		printFlags(stderr, fs)
	}
	positional, help, err := parseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(positional) != 1 {
		return errUsage{errors.New("want one URL, such as http://127.0.0.1:8080/readyz")}
	}
	u, err := url.Parse(positional[0])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errUsage{fmt.Errorf("%q: want an http:// or https:// URL", positional[0])}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	client := http.DefaultClient
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			return err
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return errUsage{fmt.Errorf("--ca %s: no PEM certificate in it", *ca)}
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	stdout.Write(body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", u, resp.Status)
	}
	return nil
}
