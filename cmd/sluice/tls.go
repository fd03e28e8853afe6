package main

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// certFiles serves the certificate of a key pair in two files and follows
// them: a renewed certificate (by certbot, cert-manager, a rotation job) is
// picked up without a restart. The files are looked at again at most once
// per recheck, on a handshake; a pair that does not load (half written, or
// a key that does not match) is logged and the previous one keeps serving.
type certFiles struct {
	certPath, keyPath string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string    // the files' sizes and modification times when loaded
	checked time.Time // when the files were last looked at
}

// recheck is how often, at most, a handshake looks at the files.
const recheck = time.Second

func loadCertFiles(certPath, keyPath string, log *slog.Logger) (*certFiles, error) {
	c := &certFiles{certPath: certPath, keyPath: keyPath, log: log}
	stamp, err := c.stampNow()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", certPath, keyPath, err)
	}
	c.cert, c.stamp, c.checked = &cert, stamp, time.Now()
	return c, nil
}

func (c *certFiles) stampNow() (string, error) {
	var stamp string
	for _, p := range []string{c.certPath, c.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		stamp += fmt.Sprintf("%d@%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

// get is tls.Config.GetCertificate.
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < recheck {
		return c.cert, nil
	}
	c.checked = time.Now()
	stamp, err := c.stampNow()
	if err != nil || stamp == c.stamp {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		c.log.Error("sluice: the renewed certificate does not load; the previous one keeps serving", "cert", c.certPath, "key", c.keyPath, "error", err)
		return c.cert, nil // tried again once the files change again
	}
	c.cert, c.stamp = &cert, stamp
	c.log.Info("sluice: certificate reloaded", "cert", c.certPath)
	return c.cert, nil
}

// config returns a server TLS configuration offering protos by ALPN.
func (c *certFiles) config(protos ...string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.get, NextProtos: protos}
}

// wrap puts TLS around ln, if c is set.
func (c *certFiles) wrap(ln net.Listener, protos ...string) net.Listener {
	if c == nil {
		return ln
	}
	return tls.NewListener(ln, c.config(protos...))
}
