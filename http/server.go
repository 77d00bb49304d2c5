// Package http serves the dbcloud API over HTTPS. It decodes requests,
// calls the domain and encodes what the domain answers; it decides nothing.
package http

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// BasePath is the API's base path; every API route is below it.
const BasePath = "/public/api/v1"

// MaxBodyBytes is the largest request body accepted (decisions.md section 1).
const MaxBodyBytes = 1 << 20

// Config holds the transport settings of the API.
type Config struct {
	// RateLimit and RateBurst bound requests per credential (tokens per
	// second and bucket size).
	RateLimit float64
	RateBurst int
	// AuthFailLimit and AuthFailBurst slow down failed authentication from
	// one address in the same way.
	AuthFailLimit float64
	AuthFailBurst int
	// MaxStreamsPerCredential caps the event streams one credential (an
	// API key, a user's login) holds at once; one more is answered 429.
	// The per-address connection cap (ServerConfig.MaxConnsPerAddr) alone
	// let one key hold hundreds, each a goroutine and a store poll per
	// second. 0 means no cap.
	MaxStreamsPerCredential int
}

// DefaultMaxStreamsPerCredential is enough for a console open in many
// tabs and a few followers, far below the per-address connection cap.
const DefaultMaxStreamsPerCredential = 32

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{RateLimit: 50, RateBurst: 100, AuthFailLimit: 1, AuthFailBurst: 10, MaxStreamsPerCredential: DefaultMaxStreamsPerCredential}
}

// ServerConfig bounds what one client can hold of the server.
type ServerConfig struct {
	// ReadTimeout bounds reading a request, body included, so a client
	// sending its body slowly cannot hold a connection; WriteTimeout
	// bounds a response; IdleTimeout a kept-alive connection between
	// requests. The event stream lifts the write deadline for itself.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConnsPerAddr caps the connections one client address holds at
	// once; further ones are closed at accept. 0 means no cap.
	MaxConnsPerAddr int
}

// DefaultServerConfig returns the defaults of dbcloud serve.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second, MaxConnsPerAddr: 256}
}

// NewServer returns an HTTP server for h with cfg's timeouts. Serve it on
// a listener from LimitConnsPerAddr. When h is the API's *Handler, its
// event streams end at Shutdown; a handler that wraps it registers
// StopStreams itself.
func NewServer(h http.Handler, cfg ServerConfig, logger *slog.Logger) *http.Server {
	header := 10 * time.Second
	if cfg.ReadTimeout > 0 {
		header = min(header, cfg.ReadTimeout)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: header,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	if api, ok := h.(*Handler); ok {
		srv.RegisterOnShutdown(api.StopStreams)
	}
	return srv
}

// StopStreams ends the event streams being served; Shutdown calls it.
func (h *Handler) StopStreams() { h.stopOnce.Do(func() { close(h.stop) }) }

func (h *Handler) shutdown() <-chan struct{} { return h.stop }

// Handler is the API's http.Handler.
type Handler struct {
	cloud  *cloud.Cloud
	logger *slog.Logger
	mux    *http.ServeMux
	limits *limiters
	// encoded keeps encoded service reads (encoded.go).
	encoded encodedCache
	// ready reports whether the server can take requests (for /readyz).
	ready atomic.Bool
	// stop is closed when the server shuts down, to end event streams,
	// which would otherwise hold the shutdown until its deadline.
	stop     chan struct{}
	stopOnce sync.Once
	// AfterIdempotentChange, when set, runs after a request with an
	// Idempotency-Key made its change and before its response is stored
	// and sent: a test hook to crash the server exactly there.
	AfterIdempotentChange func()
	// Observe, when set, is told of every request: its method, the route
	// pattern it matched ("" for none), its status and duration.
	Observe func(method, route string, status int, d time.Duration)
}

// NewHandler returns the API handler for cloud.
func NewHandler(cloud *cloud.Cloud, cfg Config, logger *slog.Logger) *Handler {
	h := &Handler{cloud: cloud, logger: logger, mux: http.NewServeMux(), limits: newLimiters(cfg), stop: make(chan struct{})}
	for _, rt := range h.routes() {
		h.mux.Handle(rt.Method+" "+BasePath+rt.Path, h.api(rt))
	}
	h.mux.HandleFunc("GET "+BasePath+"/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(dbcloud.OpenAPI)
	})
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	h.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !h.ready.Load() {
			writeJSON(w, http.StatusServiceUnavailable, errorBody{Code: "UNAVAILABLE", Message: "Starting."})
			return
		}
		if err := h.cloud.Ping(r.Context()); err != nil {
			writeError(w, r, h.logger, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	h.ready.Store(true)
	return h
}

// SetReady marks the server ready or not for /readyz.
func (h *Handler) SetReady(ok bool) { h.ready.Store(ok) }

// Route is one operation of the API.
type Route struct {
	Method, Path string
	// Body says whether the operation reads a JSON request body.
	Body bool
	fn   func(w http.ResponseWriter, r *http.Request) (int, any, error)
}

// Routes lists the API's operations, so tests can hold them against the contract.
func (h *Handler) Routes() []Route { return h.routes() }

// ServeHTTP adds the request ID and the request log line, and answers
// unknown paths and wrong methods with the API's error body.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get("X-Request-Id")
	if !validRequestID(id) {
		id = newRequestID()
	}
	w.Header().Set("X-Request-Id", id)
	r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id))
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}

	_, pattern := h.mux.Handler(r)
	if pattern == "" {
		h.unrouted(rec, r)
	} else {
		h.mux.ServeHTTP(rec, r)
	}
	if h.Observe != nil {
		_, route, _ := strings.Cut(pattern, " ") // "GET /path" -> "/path"
		h.Observe(r.Method, route, rec.status, time.Since(start))
	}
	attrs := []slog.Attr{
		slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", rec.status), slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		slog.Int64("bytes", rec.bytes), slog.String("remote", r.RemoteAddr),
	}
	if p := rec.principal; p != nil {
		if p.Key != nil {
			attrs = append(attrs, slog.String("access_key", p.Key.AccessKey))
		} else {
			attrs = append(attrs, slog.String("user_id", p.User.ID))
		}
	}
	h.logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// unrouted tells 405 from 404: ServeMux knows which, but answers in plain
// text, so its verdict is read from a throwaway recorder.
func (h *Handler) unrouted(w http.ResponseWriter, r *http.Request) {
	probe := &headerProbe{header: http.Header{}}
	h.mux.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", probe.header.Get("Allow"))
		writeError(w, r, h.logger, errMethodNotAllowed(r.Method))
		return
	}
	writeError(w, r, h.logger, &transportError{http.StatusNotFound, "NOT_FOUND", "No such path: " + r.URL.Path + "."})
}

// api wraps an operation: authentication, rate limit, body checks,
// idempotency, and the encoding of its result or error.
func (h *Handler) api(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if pid := r.PathValue("project_id"); pid != "" && r.Method == http.MethodGet {
			// The counters that authentication and a cached read of the
			// project's services (or of one service) check, in one store
			// read for all.
			scopes := []string{dbcloud.RevisionCredentials, dbcloud.RevisionServices(pid)}
			if sid := r.PathValue("service_id"); sid != "" {
				scopes = append(scopes, dbcloud.RevisionService(pid, sid))
			}
			var err error
			if ctx, err = h.cloud.WithRevisions(ctx, scopes...); err != nil {
				writeError(w, r, h.logger, err)
				return
			}
		}
		p, secret, err := h.authenticate(ctx, r)
		if err != nil {
			writeError(w, r, h.logger, err)
			return
		}
		if rec, ok := w.(*statusRecorder); ok {
			rec.principal = p
		}
		if err := h.limits.allow(p.ID()); err != nil {
			writeError(w, r, h.logger, err)
			return
		}
		body, err := readBody(r, rt.Body)
		if err != nil {
			writeError(w, r, h.logger, err)
			return
		}
		oplog := &cloud.OperationLog{}
		r = r.WithContext(cloud.NewContextWithOperationLog(cloud.NewContextWithPrincipal(ctx, p), oplog))
		if len(body) > 0 {
			r.Body = io.NopCloser(bytes.NewReader(body))
		} else {
			r.Body = http.NoBody
		}

		if key := r.Header.Get("Idempotency-Key"); key != "" && (r.Method == http.MethodPost || r.Method == http.MethodDelete) {
			h.idempotent(w, r, rt, p, secret, key, body)
			return
		}
		status, out, err := rt.fn(w, r)
		if err != nil {
			writeError(w, r, h.logger, err)
			return
		}
		if status == streamed {
			return
		}
		operationHeaders(w, r, oplog)
		writeResult(w, status, out)
	})
}

// writeResult encodes an operation's result; a nil result has no body.
func writeResult(w http.ResponseWriter, status int, out any) {
	if out == nil {
		writeRaw(w, status, nil)
		return
	}
	if b, ok := out.(encodedBody); ok {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(status)
		w.Write(b)
		return
	}
	writeJSON(w, status, out)
}

// readBody enforces the size limit and media type and returns the body.
func readBody(r *http.Request, wantBody bool) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil // the server's body of a request without one
	}
	if r.ContentLength > MaxBodyBytes {
		return nil, &transportError{http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "The request body is over the limit of 1 MiB."}
	}
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &transportError{http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "The request body is over the limit of 1 MiB."}
		}
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "The request body could not be read.")
	}
	if !wantBody || len(b) == 0 {
		return b, nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, &transportError{http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE",
				"Content-Type " + ct + " is not supported; send application/json."}
		}
	}
	return b, nil
}

// decode reads a JSON body into v. Unknown fields are ignored; a known
// field of the wrong type is named in the error.
func decode(r *http.Request, v any) error {
	b, _ := io.ReadAll(r.Body)
	if len(strings.TrimSpace(string(b))) == 0 {
		return dbcloud.Errorf(dbcloud.KindInvalid, "A JSON request body is required.")
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return dbcloud.Errorf(dbcloud.KindInvalid, "Field %s must be of JSON type %s.", te.Field, jsonType(te.Type.String()))
		}
		var pe *time.ParseError
		if errors.As(err, &pe) {
			return dbcloud.Errorf(dbcloud.KindInvalid, "A time is not an RFC 3339 date-time such as 2026-01-02T15:04:05Z: %q.", pe.Value)
		}
		return dbcloud.Errorf(dbcloud.KindInvalid, "The request body is not valid JSON: %v.", err)
	}
	return nil
}

func jsonType(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "string", "time.Time":
		return "string"
	case "int", "int64", "float64":
		return "number"
	case "bool":
		return "boolean"
	}
	if strings.HasPrefix(goType, "[]") {
		return "array"
	}
	return "object"
}

type requestIDKey struct{}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// validRequestID accepts a caller's ID only if it is short and printable, so
// it cannot forge log lines.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// statusRecorder remembers what the request log line needs.
type statusRecorder struct {
	http.ResponseWriter
	status    int
	bytes     int64
	principal *dbcloud.Principal
	wrote     bool
}

func (s *statusRecorder) WriteHeader(code int) {
	if !s.wrote {
		s.status, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.wrote = true
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

// headerProbe is a ResponseWriter that keeps only the status and headers.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }
