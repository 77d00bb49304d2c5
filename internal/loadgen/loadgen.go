// Package loadgen drives a server from many clients at once and keeps the
// latency of every request, by kind of request. Benchmarks and load tests
// share it so that their numbers mean the same thing. Two ways to drive:
// a closed loop (Run: each client sends its next request when the last one
// answered), latency from just before the request is sent to the end of
// its body; and an open loop (RunOpen: requests at a fixed rate whatever
// the answers), latency from when the request was due.
package loadgen

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Recorder collects outcomes from many goroutines.
type Recorder struct {
	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	latencies []time.Duration
	statuses  map[int]int
	errors    int
	lastError string
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{kinds: map[string]*kind{}} }

// Add records one request of a kind: its status (0 when it got no answer),
// how long it took, and the transport error if there was one.
func (r *Recorder) Add(name string, status int, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.kinds[name]
	if k == nil {
		k = &kind{statuses: map[int]int{}}
		r.kinds[name] = k
	}
	if err != nil {
		k.errors++
		k.lastError = err.Error()
		return
	}
	k.latencies = append(k.latencies, took)
	k.statuses[status]++
}

// Stats summarises the requests of one kind.
type Stats struct {
	Kind string
	// Count is the number of requests that got an answer.
	Count int
	// Errors counts requests that got no answer (transport errors); LastError
	// is the last of them.
	Errors    int
	LastError string
	// Status counts answers by status code.
	Status        map[int]int
	P50, P99, Max time.Duration
}

// Count5xx is the number of answers with a 5xx status.
func (s Stats) Count5xx() int {
	n := 0
	for code, c := range s.Status {
		if code >= 500 {
			n += c
		}
	}
	return n
}

// Stats returns the summary of every kind, by name.
func (r *Recorder) Stats() []Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Stats, 0, len(r.kinds))
	for name, k := range r.kinds {
		s := Stats{Kind: name, Count: len(k.latencies), Errors: k.errors, LastError: k.lastError, Status: map[int]int{}}
		for code, n := range k.statuses {
			s.Status[code] = n
		}
		s.P50, s.P99, s.Max = Percentile(k.latencies, 0.50), Percentile(k.latencies, 0.99), Percentile(k.latencies, 1)
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

// Latencies returns a copy of the latencies recorded for a kind.
func (r *Recorder) Latencies(name string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := r.kinds[name]; k != nil {
		return slices.Clone(k.latencies)
	}
	return nil
}

// Percentile returns the p-quantile (0 to 1) of d by the nearest-rank
// method, or 0 for no samples.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999999) - 1 // ceil(n*p) - 1
	return s[max(0, min(len(s)-1, i))]
}

// Run calls client(ctx, i) for i in [0, clients) in goroutines of their
// own, each in a loop until duration has passed (or ctx is done), and
// returns the time it took. A client's loop body is one request.
func Run(ctx context.Context, clients int, duration time.Duration, client func(ctx context.Context, i int)) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				client(ctx, i)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// NewClient returns an HTTPS client that keeps up to conns connections to
// a host alive, so a run measures requests rather than handshakes, and
// never opens more than conns: a request that finds none idle dials at
// once, and the connection freed meanwhile joins the idle ones, so
// without the cap a run of 200 clients holds well over 200. dbcloud
// serve closes connections beyond its cap per client address (256) at
// accept, which such a client sees as EOF.
func NewClient(tlsConfig *tls.Config, conns int) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: tlsConfig, MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
			IdleConnTimeout: time.Minute, ForceAttemptHTTP2: false,
		},
	}
}

// Do sends req with client, reads the whole answer and records it under
// name. It returns the status and body; a transport error is recorded and
// returned. A request cut short because ctx ended is not recorded: the
// run was over, the server did nothing wrong. Latency runs from when the
// request was due if an open loop scheduled it (Scheduled), else from now.
func Do(ctx context.Context, rec *Recorder, client *http.Client, name string, req *http.Request) (int, []byte, error) {
	start, ok := Scheduled(ctx)
	if !ok {
		start = time.Now()
	}
	res, err := client.Do(req.WithContext(ctx))
	var body []byte
	if err == nil {
		body, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	took := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		rec.Add(name, 0, took, err)
		return 0, nil, err
	}
	rec.Add(name, res.StatusCode, took, nil)
	return res.StatusCode, body, nil
}

// Table renders stats as a Markdown table, for logs and reports.
func Table(stats []Stats, elapsed time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| kind | requests | req/s | p50 ms | p99 ms | max ms | statuses | errors |\n|---|---:|---:|---:|---:|---:|---|---:|\n")
	for _, s := range stats {
		codes := make([]int, 0, len(s.Status))
		for c := range s.Status {
			codes = append(codes, c)
		}
		sort.Ints(codes)
		var parts []string
		for _, c := range codes {
			parts = append(parts, fmt.Sprintf("%d×%d", s.Status[c], c))
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.2f | %.2f | %.2f | %s | %d |\n", s.Kind, s.Count,
			float64(s.Count)/elapsed.Seconds(), Ms(s.P50), Ms(s.P99), Ms(s.Max), strings.Join(parts, " "), s.Errors)
	}
	return b.String()
}

// Ms is d in milliseconds.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
