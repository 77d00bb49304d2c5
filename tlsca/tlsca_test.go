package tlsca_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud/tlsca"
)

// MustLoadOrCreateCA creates (or loads) a CA in dir or fails the test.
func MustLoadOrCreateCA(tb testing.TB, dir string) *tlsca.CA {
	tb.Helper()
	ca, err := tlsca.LoadOrCreateCA(dir)
	if err != nil {
		tb.Fatalf("LoadOrCreateCA(%q): %v", dir, err)
	}
	return ca
}

func TestLoadOrCreateCA(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "tls")
		created := MustLoadOrCreateCA(t, dir)
		loaded := MustLoadOrCreateCA(t, dir)

		if !created.Cert.Equal(loaded.Cert) {
			t.Errorf("loaded cert differs from created cert")
		}
		if !bytes.Equal(created.CertPEM, loaded.CertPEM) {
			t.Errorf("loaded CertPEM differs from created CertPEM")
		}
		if got, want := loaded.Cert.Subject.CommonName, "dbcloud local CA"; got != want {
			t.Errorf("CommonName = %q, want %q", got, want)
		}
		if !loaded.Cert.IsCA {
			t.Errorf("IsCA = false, want true")
		}
		if got, min := time.Until(loaded.Cert.NotAfter), 9*365*24*time.Hour; got < min {
			t.Errorf("CA valid for %v, want at least %v", got, min)
		}
		if got, want := loaded.Key.Public(), created.Cert.PublicKey; !publicKeysEqual(got, want) {
			t.Errorf("loaded key does not match created cert")
		}
	})

	t.Run("FileModes", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "tls")
		MustLoadOrCreateCA(t, dir)
		for name, want := range map[string]os.FileMode{
			"":           0o700 | os.ModeDir,
			"ca.pem":     0o644,
			"ca-key.pem": 0o600,
		} {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode(); got != want {
				t.Errorf("mode of %q = %v, want %v", name, got, want)
			}
		}
	})

	t.Run("ErrCorruptCert", func(t *testing.T) {
		dir := t.TempDir()
		MustLoadOrCreateCA(t, dir)
		if err := os.WriteFile(filepath.Join(dir, "ca.pem"), []byte("garbage"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := tlsca.LoadOrCreateCA(dir); err == nil {
			t.Errorf("LoadOrCreateCA with corrupt ca.pem: got nil error, want error")
		}
	})

	t.Run("ErrKeyMismatch", func(t *testing.T) {
		dirA, dirB := t.TempDir(), t.TempDir()
		MustLoadOrCreateCA(t, dirA)
		MustLoadOrCreateCA(t, dirB)
		keyB, err := os.ReadFile(filepath.Join(dirB, "ca-key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dirA, "ca-key.pem"), keyB, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = tlsca.LoadOrCreateCA(dirA)
		if err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Errorf("LoadOrCreateCA with foreign key: err = %v, want key mismatch", err)
		}
	})

	t.Run("ErrOnlyKey", func(t *testing.T) {
		dir := t.TempDir()
		MustLoadOrCreateCA(t, dir)
		if err := os.Remove(filepath.Join(dir, "ca.pem")); err != nil {
			t.Fatal(err)
		}
		if _, err := tlsca.LoadOrCreateCA(dir); err == nil {
			t.Errorf("LoadOrCreateCA with key but no cert: got nil error, want error")
		}
	})
}

func TestCA_IssueServerCert(t *testing.T) {
	ca := MustLoadOrCreateCA(t, t.TempDir())
	certPEM, keyPEM, err := ca.IssueServerCert("svc-1", []string{"127.0.0.1", "localhost", "::1"}, time.Hour)
	if err != nil {
		t.Fatalf("IssueServerCert: %v", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("X509KeyPair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	for _, host := range []string{"127.0.0.1", "localhost", "::1"} {
		t.Run("Verify/"+host, func(t *testing.T) {
			_, err := leaf.Verify(x509.VerifyOptions{
				DNSName:   host,
				Roots:     pool,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				t.Errorf("Verify(%s): %v", host, err)
			}
		})
	}
	t.Run("ErrOtherHost", func(t *testing.T) {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: pool}); err == nil {
			t.Errorf("Verify(example.com): got nil error, want hostname error")
		}
	})
	t.Run("SANs", func(t *testing.T) {
		if got, want := len(leaf.IPAddresses), 2; got != want {
			t.Errorf("len(IPAddresses) = %d, want %d", got, want)
		}
		if got, want := leaf.DNSNames, []string{"localhost"}; len(got) != 1 || got[0] != want[0] {
			t.Errorf("DNSNames = %v, want %v", got, want)
		}
		if got, want := leaf.Subject.CommonName, "svc-1"; got != want {
			t.Errorf("CommonName = %q, want %q", got, want)
		}
	})
	t.Run("FreshKeyAndSerial", func(t *testing.T) {
		otherPEM, _, err := ca.IssueServerCert("svc-1", []string{"localhost"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		other := mustParseLeaf(t, otherPEM)
		if leaf.SerialNumber.Cmp(other.SerialNumber) == 0 {
			t.Errorf("two certs share serial %v", leaf.SerialNumber)
		}
		if publicKeysEqual(leaf.PublicKey, other.PublicKey) {
			t.Errorf("two certs share a key, want a fresh key per cert")
		}
	})
}

func TestLoadOrCreateServerCert(t *testing.T) {
	hosts := []string{"127.0.0.1", "localhost"}

	t.Run("OK", func(t *testing.T) {
		dir := t.TempDir()
		ca := MustLoadOrCreateCA(t, dir)
		cert, err := tlsca.LoadOrCreateServerCert(dir, ca, hosts)
		if err != nil {
			t.Fatalf("LoadOrCreateServerCert: %v", err)
		}
		if got, want := len(cert.Certificate), 2; got != want {
			t.Fatalf("chain length = %d, want %d (leaf + CA)", got, want)
		}
		if !bytes.Equal(cert.Certificate[1], ca.Cert.Raw) {
			t.Errorf("chain[1] is not the CA certificate")
		}
		if got, min := time.Until(cert.Leaf.NotAfter), 364*24*time.Hour; got < min {
			t.Errorf("server cert valid for %v, want at least %v", got, min)
		}
		for name, want := range map[string]os.FileMode{"server.pem": 0o600, "server-key.pem": 0o600} {
			fi, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("mode of %s = %v, want %v", name, got, want)
			}
		}
	})

	t.Run("Reuse", func(t *testing.T) {
		dir := t.TempDir()
		ca := MustLoadOrCreateCA(t, dir)
		first := mustServerCert(t, dir, ca, hosts)
		second := mustServerCert(t, dir, ca, []string{"localhost"})
		if !bytes.Equal(first.Certificate[0], second.Certificate[0]) {
			t.Errorf("certificate covering all hosts was reissued, want reused")
		}
	})

	t.Run("ReissueMissingHost", func(t *testing.T) {
		dir := t.TempDir()
		ca := MustLoadOrCreateCA(t, dir)
		first := mustServerCert(t, dir, ca, hosts)
		second := mustServerCert(t, dir, ca, append(hosts, "db.example.internal"))
		if bytes.Equal(first.Certificate[0], second.Certificate[0]) {
			t.Fatalf("certificate missing a host was reused, want reissued")
		}
		if err := second.Leaf.VerifyHostname("db.example.internal"); err != nil {
			t.Errorf("reissued cert: %v", err)
		}
		third := mustServerCert(t, dir, ca, append(hosts, "db.example.internal"))
		if !bytes.Equal(second.Certificate[0], third.Certificate[0]) {
			t.Errorf("reissued certificate was not persisted")
		}
	})

	t.Run("ReissueOtherCA", func(t *testing.T) {
		dir := t.TempDir()
		caA := MustLoadOrCreateCA(t, filepath.Join(dir, "a"))
		caB := MustLoadOrCreateCA(t, filepath.Join(dir, "b"))
		first := mustServerCert(t, dir, caA, hosts)
		second := mustServerCert(t, dir, caB, hosts)
		if bytes.Equal(first.Certificate[0], second.Certificate[0]) {
			t.Fatalf("certificate from another CA was reused, want reissued")
		}
		if err := second.Leaf.CheckSignatureFrom(caB.Cert); err != nil {
			t.Errorf("reissued cert not signed by new CA: %v", err)
		}
	})

	t.Run("ReissueExpiring", func(t *testing.T) {
		dir := t.TempDir()
		ca := MustLoadOrCreateCA(t, dir)
		certPEM, keyPEM, err := ca.IssueServerCert("localhost", hosts, 10*24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(dir, "server.pem"), certPEM)
		mustWrite(t, filepath.Join(dir, "server-key.pem"), keyPEM)
		got := mustServerCert(t, dir, ca, hosts)
		if bytes.Equal(got.Certificate[0], mustParseLeaf(t, certPEM).Raw) {
			t.Errorf("certificate expiring in 10 days was reused, want reissued")
		}
	})

	t.Run("ReissueCorrupt", func(t *testing.T) {
		dir := t.TempDir()
		ca := MustLoadOrCreateCA(t, dir)
		mustWrite(t, filepath.Join(dir, "server.pem"), []byte("garbage"))
		mustWrite(t, filepath.Join(dir, "server-key.pem"), []byte("garbage"))
		mustServerCert(t, dir, ca, hosts)
	})
}

func TestLoadOrCreateServerCert_Handshake(t *testing.T) {
	dir := t.TempDir()
	ca := MustLoadOrCreateCA(t, dir)
	cert := mustServerCert(t, dir, ca, []string{"127.0.0.1", "localhost"})

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	// ErrUntrusted makes the server log a handshake error; it is expected.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()

	// Trust only what a user would: the ca.pem file on disk.
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.pem contains no certificate")
	}

	for _, host := range []string{"127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			client := &http.Client{Transport: &http.Transport{
				TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host},
			}}
			defer client.CloseIdleConnections()
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatalf("GET %s as %s: %v", srv.URL, host, err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := string(body), "ok"; got != want {
				t.Errorf("body = %q, want %q", got, want)
			}
		})
	}

	t.Run("ErrUntrusted", func(t *testing.T) {
		client := &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()},
		}}
		defer client.CloseIdleConnections()
		if resp, err := client.Get(srv.URL); err == nil {
			resp.Body.Close()
			t.Errorf("GET without trusting the CA: got nil error, want verification error")
		}
	})
}

func mustServerCert(tb testing.TB, dir string, ca *tlsca.CA, hosts []string) tls.Certificate {
	tb.Helper()
	cert, err := tlsca.LoadOrCreateServerCert(dir, ca, hosts)
	if err != nil {
		tb.Fatalf("LoadOrCreateServerCert(%v): %v", hosts, err)
	}
	return cert
}

func mustParseLeaf(tb testing.TB, certPEM []byte) *x509.Certificate {
	tb.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		tb.Fatalf("no PEM block in %q", certPEM)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		tb.Fatalf("parse certificate: %v", err)
	}
	return cert
}

func mustWrite(tb testing.TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatal(err)
	}
}

// publicKeysEqual compares keys by DER so the test needs no type switch.
func publicKeysEqual(a, b any) bool {
	da, errA := x509.MarshalPKIXPublicKey(a)
	db, errB := x509.MarshalPKIXPublicKey(b)
	return errA == nil && errB == nil && bytes.Equal(da, db)
}

// TestServerCertSource_RenewsWhileRunning: a running server's certificate
// is renewed before it expires, without a restart: a client connecting
// once the clock is inside the renewal margin gets a new certificate that
// is valid past the old one's expiry, and it is stored for the next start.
func TestServerCertSource_RenewsWhileRunning(t *testing.T) {
	dir := t.TempDir()
	ca := MustLoadOrCreateCA(t, dir)
	src, err := tlsca.NewServerCertSource(dir, ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	src.Now = func() time.Time { return now }
	src.Validity, src.RenewBefore = time.Hour, 10*time.Minute
	renewed := 0
	src.OnRenew = func(time.Time, error) { renewed++ }

	// As dbcloud serve configures it: no static certificate, only the
	// source (httptest would add a certificate of its own).
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: src.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	served := func() *x509.Certificate {
		t.Helper()
		// The client's clock is the server's, so it judges validity then.
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Time: func() time.Time { return now }})
		if err != nil {
			t.Fatalf("handshake at %v: %v", now, err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	first := served()
	if served().SerialNumber.Cmp(first.SerialNumber) != 0 || renewed != 0 {
		t.Fatal("a fresh certificate was replaced")
	}
	// Five minutes before the end of the first (year-long) certificate,
	// inside the 10-minute margin.
	now = first.NotAfter.Add(-5 * time.Minute)
	second := served()
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || renewed != 1 {
		t.Fatalf("the certificate was not renewed inside the margin (renewals %d)", renewed)
	}
	if !second.NotAfter.After(first.NotAfter) {
		t.Errorf("renewed certificate ends %v, not after the old one's %v", second.NotAfter, first.NotAfter)
	}
	// The short validity now applies: renewed again near its end, not before.
	now = now.Add(45 * time.Minute)
	if served().SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Error("renewed again outside the margin")
	}
	now = now.Add(10 * time.Minute)
	third := served()
	if third.SerialNumber.Cmp(second.SerialNumber) == 0 || renewed != 2 {
		t.Errorf("not renewed 5 minutes before the end (renewals %d)", renewed)
	}
	// The renewal is stored: the next start serves it.
	stored, err := os.ReadFile(filepath.Join(dir, tlsca.ServerCertFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(stored)
	if block == nil || !bytes.Equal(block.Bytes, third.Raw) {
		t.Error("the renewed certificate was not stored")
	}
}

// TestServerConfig_AEADOnly: a client offering only CBC (or SHA-1) suites
// over TLS 1.2, or only TLS 1.1, gets no connection; AEAD over TLS 1.2 and
// TLS 1.3 do.
func TestServerConfig_AEADOnly(t *testing.T) {
	dir := t.TempDir()
	ca := MustLoadOrCreateCA(t, dir)
	cert, err := tlsca.LoadOrCreateServerCert(dir, ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range tlsca.CipherSuites() {
		for _, insecure := range tls.InsecureCipherSuites() {
			if insecure.ID == id {
				t.Errorf("suite %s is insecure", insecure.Name)
			}
		}
		if name := tls.CipherSuiteName(id); !strings.Contains(name, "GCM") && !strings.Contains(name, "CHACHA20") {
			t.Errorf("suite %s is not AEAD", name)
		}
	}
	// A listener as dbcloud serve has (httptest would add a certificate of its own).
	ln, err := tls.Listen("tcp", "127.0.0.1:0", tlsca.ServerConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	addr := ln.Addr().String()
	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(caPEM)
	dial := func(c *tls.Config) error {
		c.RootCAs, c.ServerName = roots, "127.0.0.1"
		conn, err := tls.Dial("tcp", addr, c)
		if err == nil {
			conn.Close()
		}
		return err
	}
	for _, c := range []struct {
		name string
		cfg  *tls.Config
		ok   bool
	}{
		{"TLS 1.2 ECDHE-ECDSA-AES128-CBC-SHA", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA}}, false},
		{"TLS 1.2 ECDHE-ECDSA-AES128-CBC-SHA256", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}}, false},
		{"TLS 1.1", &tls.Config{MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, false},
		{"TLS 1.2 ECDHE-ECDSA-AES128-GCM", &tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}, true},
		{"TLS 1.3", &tls.Config{MinVersion: tls.VersionTLS13}, true},
	} {
		if err := dial(c.cfg); (err == nil) != c.ok {
			t.Errorf("%s: handshake error %v, want success %v", c.name, err, c.ok)
		}
	}
}
