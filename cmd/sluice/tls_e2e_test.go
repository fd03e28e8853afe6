package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// writeCert writes a self-signed certificate for 127.0.0.1 with the given
// serial, and its key, to cert.pem and key.pem in dir (replacing them as a
// renewal would: written aside, then renamed), and returns the certificate.
func writeCert(t *testing.T, dir string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "sluice test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	for name, block := range map[string]*pem.Block{"cert.pem": {Type: "CERTIFICATE", Bytes: der}, "key.pem": {Type: "EC PRIVATE KEY", Bytes: kb}} {
		tmp := filepath.Join(dir, name+".new")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	return cert
}

// serialSeen makes a new TLS connection to addr, trusting the given
// certificates, and returns the serial of the certificate it was shown.
func serialSeen(t *testing.T, addr string, trust ...*x509.Certificate) int64 {
	t.Helper()
	pool := x509.NewCertPool()
	for _, c := range trust {
		pool.AddCert(c)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// With --tls-cert and --tls-key, serve answers HTTPS and gRPC over TLS, and
// a renewed certificate is served without a restart; a renewal that does
// not load leaves the previous certificate serving. The gateway's front
// listener serves TLS too.
func TestTLSOnEveryListenerAndRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	first := writeCert(t, dir, 1)
	rulesPath := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rulesPath, []byte("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"), 0o600)
	grpcAddr := freeAddr(t)
	base, _ := startServe(t, "--config", rulesPath, "--grpc-listen", grpcAddr,
		"--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem"))
	if base[:8] != "https://" {
		t.Fatalf("banner address %q, want https", base)
	}
	pool := x509.NewCertPool()
	pool.AddCert(first)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := client.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("HTTPS /healthz: %d over HTTP/%d, want 200 over HTTP/2", resp.StatusCode, resp.ProtoMajor)
	}
	// sluice probe trusts the self-signed certificate with --ca, and only then.
	if code, _, errs := runCLI(t, "probe", base+"/healthz"); code != 1 || !strings.Contains(errs, "certificate") {
		t.Fatalf("probe without --ca: exit %d, %s", code, errs)
	}
	if code, out, errs := runCLI(t, "probe", "--ca", filepath.Join(dir, "cert.pem"), base+"/healthz"); code != 0 || !strings.HasPrefix(out, "ok") {
		t.Fatalf("probe --ca: exit %d, %q %s", code, out, errs)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{desc("user", "u")}}, grpc.WaitForReady(true))
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("gRPC over TLS: %v %v", r, err)
	}

	second := writeCert(t, dir, 2)
	hostPort := base[len("https://"):]
	deadline := time.Now().Add(10 * time.Second)
	for serialSeen(t, hostPort, first, second) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate was not served within 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(dir, "cert.pem"), []byte("not a certificate"), 0o600)
	time.Sleep(1100 * time.Millisecond) // past the recheck: the next handshake looks at the files
	if got := serialSeen(t, hostPort, first, second); got != 2 {
		t.Fatalf("after a broken renewal the server shows serial %d, want the previous 2", got)
	}

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("up")) }))
	defer up.Close()
	writeCert(t, dir, 3)
	gw, _ := start(t, "gateway", "--config", "../../examples/shop.yaml", "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--watch", "0", "--tls-cert", filepath.Join(dir, "cert.pem"), "--tls-key", filepath.Join(dir, "key.pem"))
	if got := serialSeen(t, gw[len("https://"):], readCert(t, filepath.Join(dir, "cert.pem"))); got != 3 {
		t.Fatalf("gateway shows serial %d, want 3", got)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
