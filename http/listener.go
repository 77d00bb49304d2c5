package http

import (
	"net"
	"sync"
)

// holdCap counts what each client holds at once, by a key (its address,
// its credential), and refuses more than max: the per-address connection
// cap and the per-credential event stream cap are both one.
type holdCap struct {
	max  int
	mu   sync.Mutex
	held map[string]int
}

func newHoldCap(max int) *holdCap { return &holdCap{max: max, held: map[string]int{}} }

// take counts one more for key and returns true, or returns false when
// key already holds max. A cap of 0 or less takes everything.
func (c *holdCap) take(key string) bool {
	if c == nil || c.max <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[key] >= c.max {
		return false
	}
	c.held[key]++
	return true
}

// release gives back one that take counted for key.
func (c *holdCap) release(key string) {
	if c == nil || c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[key]--; c.held[key] <= 0 {
		delete(c.held, key)
	}
}

// LimitConnsPerAddr returns a listener that lets each remote address hold
// at most n connections at once: one client cannot use up the server's
// connections or file descriptors. Connections over the cap are closed as
// they are accepted. n <= 0 returns ln unchanged.
func LimitConnsPerAddr(ln net.Listener, n int) net.Listener {
	if n <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, conns: newHoldCap(n)}
}

type limitListener struct {
	net.Listener
	conns *holdCap
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteHost(c)
		if !l.conns.take(addr) {
			c.Close()
			continue
		}
		return &countedConn{Conn: c, release: func() { l.conns.release(addr) }}, nil
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
