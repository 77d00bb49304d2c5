package http

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// A request whose client went away ends with context.Canceled; that is not
// the server failing, so it must not be logged as an error (operators are
// paged on those), while the same error under a live request still is.
func TestAbandonedRequestIsNotAnError(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	storeErr := fmt.Errorf("begin sqlite transaction: %w", context.Canceled)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequest("GET", "/v1/projects/p/services", nil).WithContext(ctx)
	writeError(httptest.NewRecorder(), r, logger, storeErr)
	if strings.Contains(logs.String(), `"level":"ERROR"`) || !strings.Contains(logs.String(), "abandoned") {
		t.Errorf("abandoned request: want an info line, got %s", logs.String())
	}

	logs.Reset()
	r = httptest.NewRequest("GET", "/v1/projects/p/services", nil)
	writeError(httptest.NewRecorder(), r, logger, storeErr)
	if !strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Errorf("canceled store call under a live request: want an error line, got %s", logs.String())
	}
}
