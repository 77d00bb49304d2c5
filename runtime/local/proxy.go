package local

import (
	"context"
	"dbcloud/internal/atomicfile"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ProxyCommand is the hidden first argument that makes the dbcloud binary
// run one service's endpoint proxy (RunProxy) instead of its usual
// commands. The runtime starts the proxy with os.Executable(), so the data
// plane needs no other binary.
const ProxyCommand = "__endpoint-proxy"

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
}

// RunProxy runs the endpoint proxy whose files are in args[0] until ctx
// ends (SIGTERM). SIGHUP, or a changed proxy.json seen by polling, applies
// a new config: connections to a target that is no longer listed are
// closed, so no client stays on a fenced or demoted primary or on a removed
// replica.
func RunProxy(ctx context.Context, args []string) error {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		return fmt.Errorf("usage: dbcloud %s ABSOLUTE_PROXY_DIR", ProxyCommand)
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
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		// Half-close: PostgreSQL's protocol does not use it, so close both.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
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

// --- the runtime's side ---

func (rt *Runtime) proxyDir(serviceID string) string {
	return filepath.Join(rt.serviceDir(serviceID), "proxy")
}

// proxyChildren are the proxies this process started: it reaps them.
var proxyChildren sync.Map // pid -> chan struct{} (closed at exit)

// runningProxy returns the PID of the live proxy of dir, checked against
// its command line so a reused PID is not taken for it.
func runningProxy(dir string) (int, bool) {
	raw, err := os.ReadFile(filepath.Join(dir, proxyPidFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 1 || !processAlive(pid) {
		return 0, false
	}
	if ch, ok := proxyChildren.Load(pid); ok {
		select {
		case <-ch.(chan struct{}):
			return 0, false
		default:
		}
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, false
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) != 3 || args[1] != ProxyCommand || args[2] != dir {
		return 0, false
	}
	return pid, true
}

func (rt *Runtime) proxyRunning(serviceID string) bool {
	_, ok := runningProxy(rt.proxyDir(serviceID))
	return ok
}

// setProxy makes the proxy of a service (or read replica set) listen on
// listen and forward to targets (none: refuse), starting it if it does not
// run, and returns once the proxy has applied exactly this config.
func (rt *Runtime) setProxy(ctx context.Context, serviceID string, listen []string, targets ...string) error {
	dir := rt.proxyDir(serviceID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cfg := proxyConfig{Generation: time.Now().UnixNano(), Listen: listen, Targets: targets}
	data, _ := json.Marshal(cfg)
	if err := atomicfile.Write(filepath.Join(dir, proxyConfigFile), data, 0o600); err != nil {
		return err
	}
	pid, ok := runningProxy(dir)
	if ok {
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			return fmt.Errorf("signal proxy %d: %w", pid, err)
		}
	} else {
		var err error
		if pid, err = rt.spawnProxy(dir); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(proxyApplyTimeout)
	for {
		raw, _ := os.ReadFile(filepath.Join(dir, proxyAppliedFile))
		if g, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64); err == nil && g == cfg.Generation {
			if _, ok := runningProxy(dir); ok {
				rt.cfg.Logger.Info("endpoint proxy set", "service", serviceID, "pid", pid, "targets", strings.Join(targets, ","))
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("proxy of %s did not apply its config within %v%s", serviceID, proxyApplyTimeout,
				logTail(filepath.Join(dir, proxyLogFile), 0))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}

// spawnProxy starts the proxy in its own session, so it outlives dbcloud
// and keeps client connections open across a restart of the control plane.
func (rt *Runtime) spawnProxy(dir string) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("start proxy: %w", err)
	}
	_ = os.Remove(filepath.Join(dir, proxyPidFile))
	logFile, err := os.OpenFile(filepath.Join(dir, proxyLogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	cmd := exec.Command(exe, ProxyCommand, dir)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start proxy: %w", err)
	}
	exited := make(chan struct{})
	proxyChildren.Store(cmd.Process.Pid, exited)
	go func() {
		cmd.Wait()
		proxyChildren.Delete(cmd.Process.Pid)
		close(exited)
	}()
	return cmd.Process.Pid, nil
}

// stopProxy stops the service's proxy by PID (SIGTERM, then SIGKILL) and
// removes its files. It is idempotent.
func (rt *Runtime) stopProxy(ctx context.Context, serviceID string) error {
	dir := rt.proxyDir(serviceID)
	if pid, ok := runningProxy(dir); ok {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(5 * time.Second)
		for proxyAlive(pid) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				deadline = time.Now().Add(5 * time.Second)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pollInterval):
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func proxyAlive(pid int) bool {
	if ch, ok := proxyChildren.Load(pid); ok {
		select {
		case <-ch.(chan struct{}):
			return false
		default:
			return true
		}
	}
	return processAlive(pid)
}
