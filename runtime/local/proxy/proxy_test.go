package proxy

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"dbcloud/internal/testports"
)

// backend is a loopback TCP server that greets every connection with its
// name and then holds it open.
type backend struct {
	name string
	l    net.Listener
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(name + "\n"))
			go func() { // hold until the peer closes
				buf := make([]byte, 1)
				c.Read(buf)
				c.Close()
			}()
		}
	}()
	return &backend{name: name, l: l}
}

func (b *backend) addr() string { return b.l.Addr().String() }

// applyProxyConfig writes proxy.json as the runtime does and has the proxy
// apply it.
func applyProxyConfig(t *testing.T, p *proxy, gen int64, listen string, targets ...string) {
	t.Helper()
	data, _ := json.Marshal(proxyConfig{Generation: gen, Listen: []string{listen}, Targets: targets})
	if err := os.WriteFile(filepath.Join(p.dir, proxyConfigFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.reload(); err != nil {
		t.Fatal(err)
	}
}

// greet connects through the proxy and returns the backend's name ("" when
// the proxy closed the connection) and the open connection.
func greet(t *testing.T, addr string) (string, net.Conn) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return "", nil
	}
	c.SetReadDeadline(time.Time{})
	return line[:len(line)-1], c
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(testports.MustPort(t))
}

// TestProxy_Balancing: a read replica set's endpoint spreads connections
// round-robin over its nodes, skips a node that refuses, and closes only the
// connections of a node that leaves the set.
func TestProxy_Balancing(t *testing.T) {
	p := &proxy{dir: t.TempDir(), listeners: map[string]net.Listener{}, conns: map[net.Conn]string{}}
	t.Cleanup(p.closeAll)
	a, b, c := startBackend(t, "a"), startBackend(t, "b"), startBackend(t, "c")
	listen := freeLoopbackAddr(t)
	applyProxyConfig(t, p, 1, listen, a.addr(), b.addr(), c.addr())

	type opened struct {
		node string
		conn net.Conn
	}
	var open []opened
	counts := map[string]int{}
	for range 6 {
		name, conn := greet(t, listen)
		counts[name]++
		open = append(open, opened{name, conn})
	}
	if counts["a"] != 2 || counts["b"] != 2 || counts["c"] != 2 {
		t.Fatalf("6 connections went %v, want 2 to each node", counts)
	}

	// A node that refuses is skipped: every client still gets one.
	c.l.Close()
	for range 6 {
		name, conn := greet(t, listen)
		if name == "" || name == "c" {
			t.Fatalf("connection went to %q with node c down", name)
		}
		conn.Close()
	}

	// Nodes b and c leave: their connections are closed, a's stay open.
	applyProxyConfig(t, p, 2, listen, a.addr())
	for _, o := range open {
		o.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err := o.conn.Read(make([]byte, 1))
		var ne net.Error
		stillOpen := errors.As(err, &ne) && ne.Timeout()
		if stillOpen != (o.node == "a") {
			t.Errorf("connection to node %s: open %v after the set shrank to a (%v)", o.node, stillOpen, err)
		}
		o.conn.Close()
	}

	// No targets: every connection is refused (closed at once).
	applyProxyConfig(t, p, 3, listen)
	if name, _ := greet(t, listen); name != "" {
		t.Fatalf("connection reached %q with no targets", name)
	}
}

// applyPaused is applyProxyConfig with the proxy paused.
func applyPaused(t *testing.T, p *proxy, gen int64, listen string, targets ...string) {
	t.Helper()
	data, _ := json.Marshal(proxyConfig{Generation: gen, Listen: []string{listen}, Targets: targets, Paused: true})
	if err := os.WriteFile(filepath.Join(p.dir, proxyConfigFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.reload(); err != nil {
		t.Fatal(err)
	}
}

// TestProxy_PauseHoldsNewConnections: a paused proxy holds a new
// connection instead of forwarding it to the old target, keeps the ones
// already open, and on resume forwards the held one to the new target (a
// major version switch: no session reaches the old server once paused).
func TestProxy_PauseHoldsNewConnections(t *testing.T) {
	p := &proxy{dir: t.TempDir(), listeners: map[string]net.Listener{}, conns: map[net.Conn]string{}}
	t.Cleanup(p.closeAll)
	blue, green := startBackend(t, "blue"), startBackend(t, "green")
	listen := freeLoopbackAddr(t)
	applyProxyConfig(t, p, 1, listen, blue.addr())
	name, open := greet(t, listen)
	if name != "blue" {
		t.Fatalf("before the pause a connection reached %q, want blue", name)
	}
	defer open.Close()

	applyPaused(t, p, 2, listen, blue.addr())
	held, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		n := p.held
		p.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			held.SetReadDeadline(time.Now().Add(time.Second))
			line, _ := bufio.NewReader(held).ReadString('\n')
			t.Fatalf("paused proxy holds %d connections, want 1 (the new one reached %q)", n, line)
		}
		time.Sleep(10 * time.Millisecond)
	}

	applyProxyConfig(t, p, 3, listen, green.addr())
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(held).ReadString('\n')
	if err != nil || line != "green\n" {
		t.Fatalf("held connection after resume read %q (%v), want green", line, err)
	}
	// The one open before the pause was to blue, which left: closed.
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection to the old target still open after the switch")
	}
}
