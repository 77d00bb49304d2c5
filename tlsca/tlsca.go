// Package tlsca keeps the server's local certificate authority.
//
// The server always speaks HTTPS. When the operator configures no certificate,
// the server creates a CA in its data directory and issues its own server
// certificate from it; clients trust that one CA file. Every PostgreSQL service
// later gets its own server certificate from the same CA, so one trusted file
// covers the API and all databases.
package tlsca

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"dbcloud/internal/atomicfile"
	"dbcloud/internal/flock"
)

// File names inside the TLS directory. They are fixed so that the server can
// print where the CA lives and operators can find it without configuration.
const (
	CAFile            = "ca.pem"
	CAKeyFile         = "ca-key.pem"
	ServerCertFile    = "server.pem"
	ServerCertKeyFile = "server-key.pem"
	// caLockFile serialises the creation of the CA between processes.
	caLockFile = ".ca.lock"
)

const (
	// caValidity is long because replacing the CA means every client must
	// re-trust the server; ten years outlives any realistic install.
	caValidity = 10 * 365 * 24 * time.Hour
	// serverValidity is short enough that a leaked key expires, and the
	// renewal margin lets a running server pick up a fresh one on restart
	// before clients start rejecting it.
	serverValidity    = 365 * 24 * time.Hour
	serverRenewBefore = 30 * 24 * time.Hour
	// clockSkew backdates NotBefore so that a client whose clock is slightly
	// behind does not reject a certificate issued a second ago.
	clockSkew = 5 * time.Minute
)

// caCommonName names the CA so that users recognise it in trust stores and
// browser warnings.
const caCommonName = "dbcloud local CA"

// CA is a certificate authority able to issue server certificates. CertPEM is
// kept alongside the parsed certificate because clients and PostgreSQL's
// ssl_ca_file need the exact bytes, and re-encoding would be wasteful.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// LoadOrCreateCA returns the CA stored in dir, creating it on first use.
// Loading is strict (a corrupt file or a key that does not belong to the
// certificate is an error, not a reason to regenerate) because silently
// replacing the CA would break every client that already trusts it.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create tls dir %s: %w", dir, err)
	}
	// Control planes sharing dir may start together: one creates the CA,
	// the others wait and load it. The lock file is freed if a holder dies.
	lock, err := flock.Wait(context.Background(), filepath.Join(dir, caLockFile))
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	certPath := filepath.Join(dir, CAFile)
	keyPath := filepath.Join(dir, CAKeyFile)

	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := os.ReadFile(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		ca, err := parseCA(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("load ca from %s: %w", dir, err)
		}
		return ca, nil
	case errors.Is(certErr, os.ErrNotExist) && errors.Is(keyErr, os.ErrNotExist):
		// First start: fall through to creation.
	case certErr != nil && !errors.Is(certErr, os.ErrNotExist):
		return nil, fmt.Errorf("read ca cert: %w", certErr)
	case keyErr != nil && !errors.Is(keyErr, os.ErrNotExist):
		return nil, fmt.Errorf("read ca key: %w", keyErr)
	default:
		// Exactly one file exists. Regenerating would orphan whatever trusts
		// the surviving half, so let the operator decide.
		return nil, fmt.Errorf("load ca from %s: only one of %s and %s exists", dir, CAFile, CAKeyFile)
	}

	ca, keyPEM, err := newCA()
	if err != nil {
		return nil, err
	}
	// Write the key first: a crash between the two writes then leaves a key
	// without a certificate, which the next start reports instead of trusting
	// a certificate whose key is lost.
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write ca key: %w", err)
	}
	if err := atomicfile.Write(certPath, ca.CertPEM, 0o644); err != nil {
		return nil, fmt.Errorf("write ca cert: %w", err)
	}
	return ca, nil
}

// newCA generates a fresh self-signed CA and returns it with its PEM key.
func newCA() (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate ca key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: caCommonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// MaxPathLenZero: this CA signs leaves only, never intermediates.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("create ca cert: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse new ca cert: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	ca := &CA{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
	}
	return ca, keyPEM, nil
}

// parseCA parses a stored CA and checks that the key belongs to the
// certificate and that the certificate may sign others.
func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("ca cert: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("ca cert is not a CA certificate")
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	if err := checkKeyMatches(cert, key); err != nil {
		return nil, fmt.Errorf("ca key: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// IssueServerCert issues a certificate for a TLS server reachable under hosts.
// Hosts that parse as IP addresses become IP SANs and the rest DNS SANs,
// because clients verify IPs only against IP SANs. Each call generates a new
// key: server keys are never shared between the API and database services.
func (ca *CA) IssueServerCert(commonName string, hosts []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	return ca.issueServerCert(commonName, hosts, validFor, time.Now())
}

func (ca *CA) issueServerCert(commonName string, hosts []string, validFor time.Duration, now time.Time) (certPEM, keyPEM []byte, err error) {
	if validFor <= 0 {
		return nil, nil, fmt.Errorf("issue server cert %q: validity %v must be positive", commonName, validFor)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server cert %q: generate key: %w", commonName, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, fmt.Errorf("issue server cert %q: %w", commonName, err)
	}
	notAfter := now.Add(validFor)
	// A leaf that outlives its issuer fails verification anyway; clamp it so
	// the expiry check in LoadOrCreateServerCert sees the real deadline.
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server cert %q: %w", commonName, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue server cert %q: %w", commonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// LoadOrCreateServerCert returns the API server's certificate stored in dir,
// issuing a new one when the stored one is missing, unreadable, from another
// CA, close to expiry, or does not cover every name in hosts. Reissuing on any
// doubt is safe here, unlike for the CA, because clients trust the CA, not
// the leaf. The returned certificate carries the CA in its chain so clients
// that only know the CA can build the path.
func LoadOrCreateServerCert(dir string, ca *CA, hosts []string) (tls.Certificate, error) {
	return loadOrCreateServerCert(dir, ca, hosts, time.Now(), serverValidity, serverRenewBefore)
}

func loadOrCreateServerCert(dir string, ca *CA, hosts []string, now time.Time, validity, renewBefore time.Duration) (tls.Certificate, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, fmt.Errorf("create tls dir %s: %w", dir, err)
	}
	certPath := filepath.Join(dir, ServerCertFile)
	keyPath := filepath.Join(dir, ServerCertKeyFile)

	if certPEM, err := os.ReadFile(certPath); err == nil {
		if keyPEM, err := os.ReadFile(keyPath); err == nil {
			if cert, ok := reusableServerCert(certPEM, keyPEM, ca, hosts, now, renewBefore); ok {
				return cert, nil
			}
		}
	}

	commonName := "dbcloud"
	if len(hosts) > 0 {
		commonName = hosts[0]
	}
	certPEM, keyPEM, err := ca.issueServerCert(commonName, hosts, validity, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, fmt.Errorf("write server key: %w", err)
	}
	if err := atomicfile.Write(certPath, certPEM, 0o600); err != nil {
		return tls.Certificate{}, fmt.Errorf("write server cert: %w", err)
	}
	cert, err := tlsCertificate(certPEM, keyPEM, ca)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load new server cert: %w", err)
	}
	return cert, nil
}

// reusableServerCert reports whether a stored server certificate can be kept.
func reusableServerCert(certPEM, keyPEM []byte, ca *CA, hosts []string, now time.Time, renewBefore time.Duration) (tls.Certificate, bool) {
	cert, err := tlsCertificate(certPEM, keyPEM, ca)
	if err != nil {
		return tls.Certificate{}, false
	}
	leaf := cert.Leaf
	if err := leaf.CheckSignatureFrom(ca.Cert); err != nil {
		return tls.Certificate{}, false
	}
	if now.Add(renewBefore).After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return tls.Certificate{}, false
	}
	for _, h := range hosts {
		if err := leaf.VerifyHostname(h); err != nil {
			return tls.Certificate{}, false
		}
	}
	return cert, true
}

// tlsCertificate builds a tls.Certificate whose chain is leaf then CA.
func tlsCertificate(certPEM, keyPEM []byte, ca *CA) (tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return tls.Certificate{}, err
		}
	}
	// Keep only the leaf from the file and append the CA ourselves, so the
	// chain is right even if the file was written by an older version.
	cert.Certificate = [][]byte{cert.Certificate[0], ca.Cert.Raw}
	return cert, nil
}

// randomSerial returns a random 128-bit serial number; RFC 5280 requires
// uniqueness per issuer and random serials make collisions negligible without
// keeping a counter on disk.
func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	return serial, nil
}

// encodeKey encodes a private key as PKCS#8 PEM, the format both Go and
// PostgreSQL read.
func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCertPEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return cert, nil
}

// parseKeyPEM accepts PKCS#8 (what we write) and SEC 1 "EC PRIVATE KEY",
// so a CA key converted by hand with openssl still loads.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("unsupported PEM block %q", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key type %T cannot sign", key)
	}
	return signer, nil
}

// checkKeyMatches compares public keys by their DER encoding, which works for
// any key type without type switches.
func checkKeyMatches(cert *x509.Certificate, key crypto.Signer) error {
	want, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil {
		return fmt.Errorf("marshal cert public key: %w", err)
	}
	got, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("marshal key public key: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("private key does not match certificate")
	}
	return nil
}

// ServerCertSource serves the API server's certificate and renews it while
// the server runs: a server up for longer than the certificate's validity
// would otherwise serve an expired one. Each handshake checks the current
// certificate; inside the renewal margin a new one is issued and stored
// (as LoadOrCreateServerCert does at start), and a failed renewal keeps
// serving the current one and is retried at the next handshake.
type ServerCertSource struct {
	dir   string
	ca    *CA
	hosts []string
	// Now, Validity and RenewBefore are the clock and the lifetime of
	// issued certificates; tests shorten them.
	Now         func() time.Time
	Validity    time.Duration
	RenewBefore time.Duration
	// OnRenew, when set, is told of each renewal (for the log).
	OnRenew func(notAfter time.Time, err error)

	mu      sync.Mutex
	cert    tls.Certificate
	retryAt time.Time // after a failed renewal, not before this
}

// NewServerCertSource loads or issues the certificate in dir.
func NewServerCertSource(dir string, ca *CA, hosts []string) (*ServerCertSource, error) {
	s := &ServerCertSource{dir: dir, ca: ca, hosts: hosts, Now: time.Now, Validity: serverValidity, RenewBefore: serverRenewBefore}
	cert, err := LoadOrCreateServerCert(dir, ca, hosts)
	if err != nil {
		return nil, err
	}
	s.cert = cert
	return s, nil
}

// GetCertificate is tls.Config's GetCertificate.
func (s *ServerCertSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.Now()
	if now.Add(s.RenewBefore).Before(s.cert.Leaf.NotAfter) || now.Before(s.retryAt) {
		c := s.cert
		return &c, nil
	}
	cert, err := loadOrCreateServerCert(s.dir, s.ca, s.hosts, now, s.Validity, s.RenewBefore)
	if err == nil {
		s.cert = cert
	} else {
		s.retryAt = now.Add(time.Minute)
	}
	if s.OnRenew != nil {
		s.OnRenew(s.cert.Leaf.NotAfter, err)
	}
	c := s.cert
	return &c, nil
}

// CipherSuites are the TLS 1.2 suites dbcloud's HTTPS server accepts:
// ECDHE key exchange with an AEAD cipher (AES-GCM, ChaCha20-Poly1305),
// no CBC mode and no SHA-1 MAC, which Go's defaults still include. TLS
// 1.3's suites, which Go does not let one configure, are all AEAD.
func CipherSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

// ServerConfig is the TLS configuration of dbcloud's HTTPS server around
// a certificate source: TLS 1.2 or newer, AEAD suites only.
func ServerConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{GetCertificate: getCertificate, MinVersion: tls.VersionTLS12, CipherSuites: CipherSuites()}
}
