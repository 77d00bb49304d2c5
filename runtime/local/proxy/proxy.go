// Package proxy is a service's stable endpoint: a small L4 proxy process
// that forwards every TCP connection, bytes untouched (TLS and SCRAM stay
// end to end with PostgreSQL), to the current primary, or round-robin to
// the nodes of a read replica set. It runs as a process of its own, so
// client connections survive a restart of the control plane; the
// Controller starts it, points it elsewhere and stops it.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"dbcloud/internal/atomicfile"
)

// Command is the hidden first argument that makes the dbcloud binary run
// one endpoint proxy (Run) instead of its usual commands. The controller
// starts the proxy with os.Executable(), so the data plane needs no other
// binary.
const Command = "__endpoint-proxy"

// Files of a proxy, in DATA/services/<id>/proxy.
const (
	proxyConfigFile  = "proxy.json"    // written by the runtime
	proxyPidFile     = "proxy.pid"     // written by the proxy once it listens
	proxyAppliedFile = "proxy.applied" // the config generation in force
	proxyLogFile     = "proxy.log"
	// proxyPoll is how often the proxy looks for a new config without a
	// SIGHUP (a lost signal must not leave it on an old primary).
	proxyPoll = 200 * time.Millisecond
	// proxyApplyTimeout bounds how long the runtime waits for a proxy to
	// take a new target.
	proxyApplyTimeout = 5 * time.Second
	// proxyDialTimeout bounds one attempt to reach a target.
	proxyDialTimeout = 5 * time.Second
	// proxyHoldTimeout bounds how long a paused proxy holds a new
	// connection before it closes it: a switch that takes longer has
	// failed, and the client is better told by a closed connection.
	proxyHoldTimeout = 30 * time.Second
)

// proxyConfig is what an endpoint proxy does: listen on the endpoint
// addresses and forward every TCP connection, bytes untouched (TLS and
// SCRAM stay end to end with PostgreSQL), to one of Targets.
type proxyConfig struct {
	// Generation increases with every write; the proxy reports the one it
	// applied in proxy.applied, which is how the runtime knows a switch is
	// done.
	Generation int64    `json:"generation"`
	Listen     []string `json:"listen"`
	// Targets are host:port pairs. A service's proxy has one, the current
	// primary; a read replica set's has its nodes, and new connections go
	// round-robin over them, skipping one that refuses. None refuses every
	// connection (between fencing the old primary and promoting the new).
	Targets []string `json:"targets"`
	// Paused holds every new connection, accepted but not forwarded,
	// until a config without it (or proxyHoldTimeout): a major version
	// switch moves the service to another server while no new session
	// reaches the old one, and its clients wait instead of failing.
	Paused bool `json:"paused,omitempty"`
}

// Run runs the endpoint proxy whose files are in args[0] until ctx
// ends (SIGTERM). SIGHUP, or a changed proxy.json seen by polling, applies
// a new config: connections to a target that is no longer listed are
// closed, so no client stays on a fenced or demoted primary or on a removed
// replica.
func Run(ctx context.Context, args []string) error {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		return fmt.Errorf("usage: dbcloud %s ABSOLUTE_PROXY_DIR", Command)
	}
	p := &proxy{dir: args[0], listeners: map[string]net.Listener{}, conns: map[net.Conn]string{}}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := p.reload(); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(p.dir, proxyPidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	tick := time.NewTicker(proxyPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.closeAll()
			return nil
		case <-hup:
		case <-tick.C:
		}
		if err := p.reload(); err != nil {
			fmt.Fprintf(os.Stderr, "%s proxy: reload: %v\n", time.Now().UTC().Format(time.RFC3339Nano), err)
		}
	}
}

type proxy struct {
	dir string

	mu        sync.Mutex
	gen       int64
	targets   []string
	next      int // round-robin position in targets
	listeners map[string]net.Listener
	conns     map[net.Conn]string // both sides of every forwarded connection -> its target
	// resume is open while the proxy is paused and closed when it
	// resumes; held counts the connections waiting on it.
	resume chan struct{}
	held   int
}

func (p *proxy) reload() error {
	data, err := os.ReadFile(filepath.Join(p.dir, proxyConfigFile))
	if err != nil {
		return err
	}
	var cfg proxyConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("parse %s: %w", proxyConfigFile, err)
	}
	p.mu.Lock()
	if cfg.Generation == p.gen {
		p.mu.Unlock()
		return nil
	}
	var errs []error
	for addr, l := range p.listeners {
		if !slices.Contains(cfg.Listen, addr) {
			l.Close()
			delete(p.listeners, addr)
		}
	}
	for _, addr := range cfg.Listen {
		if _, ok := p.listeners[addr]; ok {
			continue
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.listeners[addr] = l
		go p.serve(l)
	}
	for c, target := range p.conns {
		if !slices.Contains(cfg.Targets, target) {
			c.Close()
			delete(p.conns, c)
		}
	}
	p.targets = cfg.Targets
	// Targets first, then the resume: a held connection dials the new ones.
	switch {
	case cfg.Paused && p.resume == nil:
		p.resume = make(chan struct{})
	case !cfg.Paused && p.resume != nil:
		close(p.resume)
		p.resume = nil
	}
	if len(errs) == 0 {
		p.gen = cfg.Generation
	}
	p.mu.Unlock()
	if len(errs) > 0 {
		return errors.Join(errs...) // retried at the next poll
	}
	return atomicfile.Write(filepath.Join(p.dir, proxyAppliedFile), []byte(strconv.FormatInt(cfg.Generation, 10)), 0o644)
}

func (p *proxy) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and friends
			continue
		}
		go p.forward(c)
	}
}

func (p *proxy) forward(client net.Conn) {
	if !p.hold() {
		client.Close()
		return
	}
	server, target := p.dial()
	if server == nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if !slices.Contains(p.targets, target) { // removed while dialing
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client], p.conns[server] = target, target
	p.mu.Unlock()
	Splice(client, server)
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// hold waits while the proxy is paused; false when the pause outlasted
// proxyHoldTimeout.
func (p *proxy) hold() bool {
	p.mu.Lock()
	resume := p.resume
	if resume != nil {
		p.held++
	}
	p.mu.Unlock()
	if resume == nil {
		return true
	}
	defer func() {
		p.mu.Lock()
		p.held--
		p.mu.Unlock()
	}()
	t := time.NewTimer(proxyHoldTimeout)
	defer t.Stop()
	select {
	case <-resume:
		return true
	case <-t.C:
		return false
	}
}

// dial connects to the next target in turn, trying each once: a replica
// that is down is skipped rather than failing the client.
func (p *proxy) dial() (net.Conn, string) {
	p.mu.Lock()
	targets := p.targets
	start := p.next
	p.next++
	p.mu.Unlock()
	for i := range targets {
		target := targets[(start+i)%len(targets)]
		server, err := net.DialTimeout("tcp", target, proxyDialTimeout)
		if err == nil {
			return server, target
		}
	}
	return nil, ""
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.listeners {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
}

// Splice forwards bytes both ways between client and server until either
// side closes, then closes both: PostgreSQL's protocol has no half-close.
func Splice(client, server net.Conn) {
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}
