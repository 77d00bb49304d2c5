package http

import (
	"net"
	"sync"
)

// LimitConnsPerAddr returns a listener that lets each remote address hold
// at most n connections at once: one client cannot use up the server's
// connections or file descriptors. Connections over the cap are closed as
// they are accepted. n <= 0 returns ln unchanged.
func LimitConnsPerAddr(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, max: n, open: map[string]int{}}
}

type limitListener struct {
	net.Listener
	max  int
	mu   sync.Mutex
	open map[string]int
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteHost(c)
		l.mu.Lock()
		if l.open[addr] >= l.max {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[addr]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() { l.release(addr) }}, nil
	}
}

func (l *limitListener) release(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr]--; l.open[addr] <= 0 {
		delete(l.open, addr)
	}
}

func remoteHost(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// countedConn gives its slot back once, when it is closed.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
