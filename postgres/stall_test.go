package postgres_test

import (
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"dbcloud/internal/testports"
	"dbcloud/postgres"
)

// stallProxy forwards TCP connections from a loopback port of its own to
// the test server, and stops forwarding (both ways, without closing
// anything) from Stall until Resume: a connection that stalls without
// failing, as over a cut cable, whatever user the server runs as. The
// kernel closes its sockets when the test binary dies, so a stall never
// outlives it (the server's process then sees its client gone and exits).
type stallProxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by close: every copy ends

	mu      sync.Mutex
	stalled bool
	resumed chan struct{} // closed by Resume
	conns   []net.Conn
	wg      sync.WaitGroup
}

// startStallProxy starts a proxy to the package's server, closed when tb
// ends (after the cleanups registered later, such as a Store's Close).
func startStallProxy(tb testing.TB) *stallProxy {
	tb.Helper()
	port := testports.MustPort(tb)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		tb.Fatal(err)
	}
	p := &stallProxy{
		ln:     ln,
		target: net.JoinHostPort("127.0.0.1", strconv.Itoa(mustServer(tb).Port)),
		done:   make(chan struct{}),
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// dsn returns dsn (a database of the package's server) by way of p.
func (p *stallProxy) dsn(tb testing.TB, dsn string) string {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		select {
		case <-p.done: // closed meanwhile: it closed the others
			p.mu.Unlock()
			_, _ = c.Close(), s.Close()
			return
		default:
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.copy(s, c)
		go p.copy(c, s)
	}
}

// copy forwards src to dst, holding what it read while stalled, until
// either side fails or p closes; then it closes both.
func (p *stallProxy) copy(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits while p is stalled; false once p closed.
func (p *stallProxy) pass() bool {
	p.mu.Lock()
	stalled, resumed := p.stalled, p.resumed
	p.mu.Unlock()
	if !stalled {
		return true
	}
	select {
	case <-resumed:
		return true
	case <-p.done:
		return false
	}
}

// Stall stops forwarding until Resume.
func (p *stallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resumed = true, make(chan struct{})
	}
}

// Resume forwards again, what was held first.
func (p *stallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resumed)
	}
}

func (p *stallProxy) close() {
	close(p.done)
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// mustOpenStallable opens the store at dsn with its follower connection
// through a new stallProxy, and closes it when tb ends (before the proxy).
func mustOpenStallable(tb testing.TB, dsn string) (*postgres.Store, *stallProxy) {
	tb.Helper()
	proxy := startStallProxy(tb)
	s, err := postgres.OpenFollowingVia(tb.Context(), dsn, proxy.dsn(tb, dsn))
	return closeAtEnd(tb, s, err), proxy
}
