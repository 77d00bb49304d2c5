package local

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/internal/supervise"
	"dbcloud/runtime/local/postgres"
)

// TestWake_HandlerPanicRefusesClient: a panic while a wake is asked for
// ends that wake, not the process that holds every paused service's
// endpoints: the held client is told the service could not be resumed,
// and the next client is held and asks again.
func TestWake_HandlerPanicRefusesClient(t *testing.T) {
	asks := make(chan struct{}, 2)
	w := &wakers{
		logger:     slog.New(slog.DiscardHandler),
		goroutines: supervise.Group{Logger: slog.New(slog.DiscardHandler)},
		held:       map[string]*pausedService{},
		released:   map[string]int64{},
		handler: func(ctx context.Context, projectID, serviceID string) error {
			asks <- struct{}{}
			var bug map[string]int
			bug[serviceID]++ // a nil map written: a panic
			return nil
		},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pausedService{projectID: "proj", id: "svc", listeners: []net.Listener{l}}
	w.held[p.id] = p
	w.listen(p)
	t.Cleanup(w.closeAll)

	for i := range 2 {
		msg := startupRefusal(t, l.Addr().String())
		if !strings.Contains(msg, "service svc is paused and could not be resumed") {
			t.Fatalf("client %d was told %q; want the refusal", i, msg)
		}
		select {
		case <-asks:
		case <-time.After(10 * time.Second):
			t.Fatalf("client %d asked for no wake", i)
		}
	}
}

// startupRefusal sends a plain StartupMessage to addr and returns the text
// of the ErrorResponse that answers it.
func startupRefusal(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	body := []byte("\x00\x03\x00\x00user\x00tsdbadmin\x00database\x00tsdb\x00\x00")
	msg := binary.BigEndian.AppendUint32(nil, uint32(4+len(body)))
	if _, err := c.Write(append(msg, body...)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	kind, err := r.ReadByte()
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	if kind != 'E' {
		t.Fatalf("answer %q; want an ErrorResponse", kind)
	}
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		t.Fatal(err)
	}
	fields := make([]byte, n-4)
	if _, err := io.ReadFull(r, fields); err != nil {
		t.Fatal(err)
	}
	return string(fields)
}

// TestWakeFailure_DiskFull: the client held by a wake whose instance could
// not start for a full disk is told so, and that connecting again once
// space is freed wakes it, not that the service starts by itself (a
// paused service does not); other failures read as a status reason does.
func TestWakeFailure_DiskFull(t *testing.T) {
	full := fmt.Errorf("start instance s-0: %w", &postgres.DiskFullError{Dir: "/data", FreeBytes: 10 << 20})
	msg := wakeFailure(full)
	if !strings.Contains(msg, "disk holding this service's data is full (10 MiB free)") || !strings.Contains(msg, "connect again once space is freed") ||
		strings.Contains(msg, "by itself") {
		t.Errorf("a wake failed for a full disk told the client %q", msg)
	}
	if got, want := wakeFailure(dbcloud.Errorf(dbcloud.KindConflict, "No room.")), "No room."; got != want {
		t.Errorf("a wake failed with a domain error told the client %q, want %q", got, want)
	}
}
