package http

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"dbcloud"
)

// errorBody is the one error shape of the API (decisions.md section 1).
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorStatus maps each domain error kind to its HTTP status and default
// code. It is the only place where a status is chosen for an error.
var errorStatus = map[dbcloud.ErrorKind]struct {
	status int
	code   string
}{
	dbcloud.KindInvalid:      {http.StatusBadRequest, "INVALID_REQUEST"},
	dbcloud.KindUnauthorized: {http.StatusUnauthorized, "UNAUTHORIZED"},
	dbcloud.KindForbidden:    {http.StatusForbidden, "FORBIDDEN"},
	dbcloud.KindNotFound:     {http.StatusNotFound, "NOT_FOUND"},
	dbcloud.KindConflict:     {http.StatusConflict, "CONFLICT"},
	dbcloud.KindRateLimited:  {http.StatusTooManyRequests, "RATE_LIMITED"},
	dbcloud.KindUnavailable:  {http.StatusServiceUnavailable, "UNAVAILABLE"},
	dbcloud.KindInternal:     {http.StatusInternalServerError, "INTERNAL"},
}

// transportError is an error of the HTTP exchange itself (size, media type,
// method, unknown path); the domain never sees those requests.
type transportError struct {
	status  int
	code    string
	message string
}

func (e *transportError) Error() string { return e.message }

func errMethodNotAllowed(method string) error {
	return &transportError{http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method " + method + " is not allowed on this path."}
}

// errorResponse turns err into a status and body. Domain errors keep their
// message; anything else is logged in full and answered as "Internal error."
// so that no internal detail leaks.
func errorResponse(err error) (int, errorBody, time.Duration) {
	var te *transportError
	if errors.As(err, &te) {
		return te.status, errorBody{Code: te.code, Message: te.message}, 0
	}
	var de *dbcloud.Error
	if !errors.As(err, &de) || de.Kind == dbcloud.KindInternal {
		return http.StatusInternalServerError, errorBody{Code: "INTERNAL", Message: "Internal error."}, 0
	}
	m := errorStatus[de.Kind]
	code := de.Code
	if code == "" {
		code = m.code
	}
	return m.status, errorBody{Code: code, Message: de.Message}, de.RetryAfter
}

// writeError writes the error body with the headers its status needs.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	status, body, retryAfter := errorResponse(err)
	switch {
	case status == http.StatusInternalServerError && clientGone(r, err):
		// Nobody is waiting for this answer: not the server's fault.
		logger.InfoContext(r.Context(), "request abandoned by client", "request_id", requestID(r.Context()), "error", err)
	case status == http.StatusInternalServerError:
		logger.ErrorContext(r.Context(), "request failed", "request_id", requestID(r.Context()), "error", err)
	}
	switch status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Basic realm="dbcloud", Bearer realm="dbcloud"`)
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		if retryAfter > 0 || status == http.StatusTooManyRequests {
			secs := max(1, int(math.Ceil(retryAfter.Seconds())))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
		}
		if status == http.StatusServiceUnavailable {
			logger.WarnContext(r.Context(), "request refused: unavailable", "request_id", requestID(r.Context()), "error", err)
		}
	}
	writeJSON(w, status, body)
}

// clientGone reports whether err is only the request's own context ending
// because the client closed the connection.
func clientGone(r *http.Request, err error) bool {
	return errors.Is(err, context.Canceled) && r.Context().Err() != nil
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"code":"INTERNAL","message":"Internal error."}`)
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	if b != nil {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	}
	w.WriteHeader(status)
	if b != nil {
		w.Write(append(b, '\n'))
	}
}

// StatusOf is the HTTP status the API answers err with, for the console,
// which shows the same errors as pages.
func StatusOf(err error) int {
	status, _, _ := errorResponse(err)
	return status
}
