package local

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"dbcloud"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local/internal/proc"
	"dbcloud/runtime/local/postgres"
	"dbcloud/runtime/local/proxy"
)

// Wake on connect (decisions.md section 10). While a service is
// auto-paused, dbcloud itself listens on its endpoints (its own address,
// its VPC address and its pooler's port): one process for the listeners
// of every paused service, none of their own. A client that connects is
// held, bytes unread, and the service's wake is asked for at once; the
// ensure that starts it releases the listeners just before the postmaster
// binds the same addresses, and each held client is spliced, bytes
// untouched (TLS and SCRAM end to end), to the address it connected to as
// soon as that accepts. A wake that fails is told to the held clients as
// a PostgreSQL FATAL, which every client shows.

const (
	// wakeAsk bounds the handler's recording of a wake.
	wakeAsk = 10 * time.Second
	// wakeServe bounds how long a held client waits for its service.
	wakeServe = 60 * time.Second
	// wakeDialEvery is how often a held client's target is tried once its
	// listener is released: the postmaster binds within tens of
	// milliseconds, and this is the latency added to the wake at most.
	wakeDialEvery = 2 * time.Millisecond
	// wakeGreeting bounds the reading of a refused client's first message.
	wakeGreeting = 10 * time.Second
)

// wakers holds the listeners of the auto-paused services of a runtime.
type wakers struct {
	logger *slog.Logger
	// goroutines runs the accept loops, the asks and the held clients'
	// sessions, so that a panic in one costs that client, not the
	// process every tenant's endpoints are held by. Close waits for none
	// of them: a held client's session lasts as long as the client does.
	goroutines supervise.Group
	mu         sync.Mutex
	handler    dbcloud.WakeHandler
	held       map[string]*pausedService
	// released is the generation of each service whose listeners an
	// ensure let go: a HoldPaused of an older look (the health loop's
	// list read before the wake) must not take the addresses back from
	// the postmaster.
	released map[string]int64
}

// pausedService is one auto-paused service's listeners and, while a wake
// is asked for, its episode.
type pausedService struct {
	projectID, id string
	listeners     []net.Listener
	tls           *tls.Config // to tell a TLS client why its wake failed
	cur           *wakeEpisode
}

// wakeEpisode is one wake: the held clients wait for ready (the
// postmaster accepts sessions: then they dial their target) or failed
// (then are told reason). A postmaster that listens is not yet ready: it
// refuses sessions while it starts up.
type wakeEpisode struct {
	ready     chan struct{}
	readyOnce sync.Once
	failed    chan struct{}
	once      sync.Once
	reason    string
}

func newWakeEpisode() *wakeEpisode {
	return &wakeEpisode{ready: make(chan struct{}), failed: make(chan struct{})}
}

// serving lets the held clients through; nil-safe.
func (w *wakeEpisode) serving() {
	if w == nil {
		return
	}
	w.readyOnce.Do(func() { close(w.ready) })
}

// fail ends the episode for the clients still held; nil-safe.
func (w *wakeEpisode) fail(reason string) {
	if w == nil {
		return
	}
	w.once.Do(func() {
		w.reason = reason
		close(w.failed)
	})
}

// SetWakeHandler sets what a connection to an auto-paused service calls
// (dbcloud.Waker).
func (rt *Runtime) SetWakeHandler(h dbcloud.WakeHandler) {
	rt.wakes.mu.Lock()
	defer rt.wakes.mu.Unlock()
	rt.wakes.handler = h
}

// HoldPaused keeps the endpoints of an auto-paused service listening in
// this process (dbcloud.Waker); idempotent, and cheap when they are.
func (rt *Runtime) HoldPaused(ctx context.Context, svc *dbcloud.Service) error {
	rt.wakes.mu.Lock()
	_, ok := rt.wakes.held[svc.ID]
	stale := svc.Generation <= rt.wakes.released[svc.ID]
	rt.wakes.mu.Unlock()
	if ok || stale || !svc.AutoPaused() || svc.Endpoint == nil {
		return nil
	}
	p := &pausedService{projectID: svc.ProjectID, id: svc.ID}
	if certPEM, keyPEM, err := rt.serverCert(svc); err == nil {
		if cert, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
			p.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		}
	}
	for _, addr := range rt.wakeAddrs(svc) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range p.listeners {
				l.Close()
			}
			return fmt.Errorf("listen on %s for the wake of %s: %w", addr, svc.ID, err)
		}
		p.listeners = append(p.listeners, l)
	}
	rt.wakes.mu.Lock()
	defer rt.wakes.mu.Unlock()
	if _, ok := rt.wakes.held[svc.ID]; ok || svc.Generation <= rt.wakes.released[svc.ID] { // another call won
		for _, l := range p.listeners {
			l.Close()
		}
		return nil
	}
	rt.wakes.held[svc.ID] = p
	rt.wakes.listen(p)
	rt.cfg.Logger.Info("auto-paused service's endpoints held for wake on connect", "service", svc.ID, "listeners", len(p.listeners))
	return nil
}

// wakeAddrs are the endpoints of a service: its address, its VPC address
// and its pooler's, each of which wakes it.
func (rt *Runtime) wakeAddrs(svc *dbcloud.Service) []string {
	port := strconv.Itoa(svc.Endpoint.Port)
	addrs := []string{net.JoinHostPort(rt.cfg.Host, port)}
	if ep := svc.VPCEndpoint; ep != nil && net.ParseIP(rt.cfg.Host) != nil {
		addrs = append(addrs, net.JoinHostPort(ep.Host, port))
	}
	if svc.Spec.Pooler && svc.PoolerPort > 0 {
		addrs = append(addrs, net.JoinHostPort(rt.cfg.Host, strconv.Itoa(svc.PoolerPort)))
	}
	return addrs
}

// releaseWake closes the service's wake listeners, so that its postmaster
// and pooler can bind their addresses, and returns the episode whose held
// clients now wait for them (nil when none was held).
func (rt *Runtime) releaseWake(serviceID string, gen int64) *wakeEpisode {
	rt.wakes.mu.Lock()
	p, ok := rt.wakes.held[serviceID]
	delete(rt.wakes.held, serviceID)
	if gen < 0 {
		delete(rt.wakes.released, serviceID) // deleted
	} else {
		rt.wakes.released[serviceID] = max(rt.wakes.released[serviceID], gen)
	}
	rt.wakes.mu.Unlock()
	if !ok {
		return nil
	}
	for _, l := range p.listeners {
		l.Close()
	}
	return p.cur
}

// listen runs an accept loop per listener of p until it is closed.
func (w *wakers) listen(p *pausedService) {
	for _, l := range p.listeners {
		w.goroutines.Loop(context.Background(),
			supervise.Task{Name: "wake listener", Attrs: []any{"service", p.id, "address", l.Addr().String()}},
			func(context.Context) { w.accept(p, l) })
	}
}

func (w *wakers) accept(p *pausedService, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and friends
			continue
		}
		w.hold(p, c)
	}
}

// hold keeps a client of a paused service and asks for the wake once per
// episode.
func (w *wakers) hold(p *pausedService, c net.Conn) {
	w.mu.Lock()
	ep := p.cur
	first := ep == nil
	if first {
		ep = newWakeEpisode()
		p.cur = ep
	}
	handler := w.handler
	w.mu.Unlock()
	if first {
		w.logger.Info("connection to an auto-paused service; waking it", "service", p.id)
		w.goroutines.Go(supervise.Task{Name: "wake", Attrs: []any{"service", p.id}, OnPanic: func(err *supervise.PanicError) {
			w.failEpisode(p, ep, err)
		}}, func() { w.ask(p, ep, handler) })
	}
	w.goroutines.Go(supervise.Task{Name: "held client", Attrs: []any{"service", p.id}, OnPanic: func(*supervise.PanicError) { c.Close() }},
		func() { w.serveHeld(p, ep, c) })
}

// ask records the wake; a refusal (capacity, quota) fails the episode and
// the listeners wait for the next client, which asks again.
func (w *wakers) ask(p *pausedService, ep *wakeEpisode, handler dbcloud.WakeHandler) {
	err := errors.New("this dbcloud does not wake services")
	if handler != nil {
		ctx, cancel := context.WithTimeout(context.Background(), wakeAsk)
		err = handler(ctx, p.projectID, p.id)
		cancel()
	}
	if err == nil {
		return
	}
	w.logger.Warn("wake refused", "service", p.id, "error", err)
	w.failEpisode(p, ep, err)
}

// failEpisode tells the episode's held clients why, and leaves the
// listeners to the next client, which asks again.
func (w *wakers) failEpisode(p *pausedService, ep *wakeEpisode, err error) {
	w.mu.Lock()
	if p.cur == ep {
		p.cur = nil
	}
	w.mu.Unlock()
	ep.fail(wakeReason(err))
}

// closeAll closes every held listener, ending the accept loops, when the
// runtime closes: the next dbcloud process holds the addresses again.
func (w *wakers) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, p := range w.held {
		for _, l := range p.listeners {
			l.Close()
		}
		delete(w.held, id)
	}
}

// wakeReason is what a client may read of a failed wake: a domain error's
// message, or a generic text (details stay in the log).
func wakeReason(err error) string {
	var de *dbcloud.Error
	if errors.As(err, &de) && de.Kind != dbcloud.KindInternal {
		return de.Message
	}
	return "the service could not be started; the operator's logs have the details"
}

// wakeFailure is what the clients held by a wake whose start failed are
// told: what a status reason would say, except that a paused service does
// not start by itself once its disk has room again: the engine pauses it
// again, and the next connection wakes it.
func wakeFailure(err error) string {
	var full *postgres.DiskFullError
	if errors.As(err, &full) {
		return fmt.Sprintf("The disk holding this service's data is full (%d MiB free); connect again once space is freed (delete other services' data or snapshots, or ask the operator to free disk space).",
			full.FreeBytes>>20)
	}
	return wakeReason(userError(err))
}

// serveHeld splices a held client to its service once the wake has its
// postmaster ready and the address accepts (the pooler's a little later),
// or tells it why not.
func (w *wakers) serveHeld(p *pausedService, ep *wakeEpisode, c net.Conn) {
	deadline := time.NewTimer(wakeServe)
	defer deadline.Stop()
	select {
	case <-ep.ready:
	case <-ep.failed:
		refuse(c, p, ep.reason)
		return
	case <-deadline.C:
		refuse(c, p, "the service did not start in time")
		return
	}
	target := c.LocalAddr().String()
	tick := time.NewTicker(wakeDialEvery)
	defer tick.Stop()
	for {
		if server, err := dialAs(c, target); err == nil {
			proxy.Splice(c, server)
			return
		}
		select {
		case <-tick.C:
		case <-ep.failed:
			refuse(c, p, ep.reason)
			return
		case <-deadline.C:
			refuse(c, p, "the service did not start in time")
			return
		}
	}
}

// dialAs connects to target from the held client's own address where
// this host has it (every loopback address is), so that PostgreSQL's and
// PgBouncer's address rules see the client, not dbcloud.
func dialAs(client net.Conn, target string) (net.Conn, error) {
	if a, ok := client.RemoteAddr().(*net.TCPAddr); ok {
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: a.IP}}
		c, err := d.Dial("tcp", target)
		if !errors.Is(err, syscall.EADDRNOTAVAIL) {
			return c, err
		}
	}
	return net.DialTimeout("tcp", target, time.Second)
}

// clientSessions counts the client sessions on a service's endpoints for
// its idle clock: the TCP connections accepted on its port (its own
// address and its VPC address share it) and on its pooler's. dbcloud's
// own sessions and the pooler's server connections use the instance's
// unix socket and are not counted.
func (rt *Runtime) clientSessions(svc *dbcloud.Service) *int {
	ports := []int{svc.Endpoint.Port}
	if svc.Spec.Pooler && svc.PoolerPort > 0 {
		ports = append(ports, svc.PoolerPort)
	}
	n := proc.EstablishedOnPorts(ports...)
	return &n
}
