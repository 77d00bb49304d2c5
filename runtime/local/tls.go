package local

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"dbcloud"
	"dbcloud/internal/atomicfile"
)

// serverCert returns the service's TLS certificate, issuing it once from the
// CA: every service has its own key, never a template's.
func (rt *Runtime) serverCert(svc *dbcloud.Service) (certPEM, keyPEM []byte, err error) {
	dir := filepath.Join(rt.serviceDir(svc.ID), "tls")
	certPath, keyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	hosts := []string{rt.cfg.Host, "127.0.0.1", "::1", "localhost"}
	if ep := svc.VPCEndpoint; ep != nil {
		hosts = append(hosts, ep.Host)
	}
	if c, err := os.ReadFile(certPath); err == nil {
		if k, err := os.ReadFile(keyPath); err == nil && certValid(c, 30*24*time.Hour, hosts) {
			return c, k, nil
		}
	}
	certPEM, keyPEM, err = rt.cfg.CA.IssueServerCert(svc.ID, hosts, 365*24*time.Hour)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate for %s: %w", svc.ID, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.Write(certPath, certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	return certPEM, keyPEM, nil
}

// certValid reports whether the PEM certificate parses, is valid for longer
// than margin, and names every host (a VPC address is added on attach).
func certValid(certPEM []byte, margin time.Duration, hosts []string) bool {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return false
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil || time.Until(c.NotAfter) <= margin {
		return false
	}
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}
