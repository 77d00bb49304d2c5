package http_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	stdhttp "net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"dbcloud"
	"dbcloud/http"
)

// loadContract loads openapi.yaml with its server set to baseURL, so that
// each exchange of a test can be checked against it.
func loadContract(tb testing.TB, baseURL string) (*openapi3.T, routers.Router) {
	tb.Helper()
	openapi3.DefineStringFormatValidator("cidr", openapi3.NewCallbackValidator(func(s string) error {
		_, err := netip.ParsePrefix(s)
		return err
	}))
	doc, err := openapi3.NewLoader().LoadFromData(dbcloud.OpenAPI)
	if err != nil {
		tb.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		tb.Fatalf("openapi.yaml is not valid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: baseURL}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		tb.Fatalf("router: %v", err)
	}
	return doc, router
}

// checkExchange validates a request and its response against the contract.
// Error responses of paths the contract does not have (404, 405) are checked
// for the error body only.
func checkExchange(tb testing.TB, router routers.Router, req *stdhttp.Request, body []byte, status int, header stdhttp.Header, respBody []byte) {
	tb.Helper()
	route, params, err := router.FindRoute(req)
	if err != nil {
		if status != stdhttp.StatusNotFound && status != stdhttp.StatusMethodNotAllowed {
			tb.Errorf("%s %s: not in the contract, yet answered %d", req.Method, req.URL.Path, status)
		}
		checkErrorBody(tb, status, respBody)
		return
	}
	opts := &openapi3filter.Options{
		AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
		MultiError:         true,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if status < 400 {
		// Requests the server accepted must be valid per the contract.
		req.Body = io.NopCloser(bytes.NewReader(body))
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			tb.Errorf("%s %s: request the server accepted is invalid per the contract: %v", req.Method, req.URL.Path, err)
		}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: header,
		Body: io.NopCloser(bytes.NewReader(respBody)), Options: opts,
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		tb.Errorf("%s %s: response %d does not match the contract: %v\nbody: %s", req.Method, req.URL.Path, status, err, respBody)
	}
	if status >= 400 {
		checkErrorBody(tb, status, respBody)
	}
}

func checkErrorBody(tb testing.TB, status int, body []byte) {
	tb.Helper()
	if status < 400 {
		return
	}
	var e struct{ Code, Message string }
	if err := json.Unmarshal(body, &e); err != nil || e.Code == "" || e.Message == "" {
		tb.Errorf("status %d: error body %q is not {code, message}", status, body)
	}
	if strings.ToUpper(e.Code) != e.Code {
		tb.Errorf("error code %q is not UPPER_SNAKE_CASE", e.Code)
	}
}

// TestRoutes_MatchContract holds the served routes and the contract's
// operations against each other, both ways.
func TestRoutes_MatchContract(t *testing.T) {
	doc, _ := loadContract(t, "https://127.0.0.1"+http.BasePath)
	inContract := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inContract[method+" "+path] = true
		}
	}
	served := map[string]bool{}
	for _, rt := range (&http.Handler{}).Routes() {
		served[rt.Method+" "+rt.Path] = true
		if !inContract[rt.Method+" "+rt.Path] {
			t.Errorf("served but not in openapi.yaml: %s %s", rt.Method, rt.Path)
		}
	}
	for op := range inContract {
		if !served[op] {
			t.Errorf("in openapi.yaml but not served: %s", op)
		}
	}
	// The API document's 35 operations, and the 5 of decisions.md
	// section 1 that the original's clients call beyond it (service
	// rename, the two analytics reports, the two metrics previews), and
	// the 7 of the history: the event stream, one operation, four
	// operation lists and snapshots, and the 3 of database credentials
	// (decisions.md section 12), setAutoPause (section 10) and
	// upgradeService (section 11).
	if len(served) != 52 {
		t.Errorf("served %d operations, want the 52 of the contract", len(served))
	}
}
