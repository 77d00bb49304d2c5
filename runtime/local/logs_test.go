package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"dbcloud"
)

// writeLog appends jsonlog lines, as PostgreSQL 15 writes them, to the log
// file name of instance node of service id.
func writeLog(tb testing.TB, rt *Runtime, id string, node int, name string, lines ...[3]string) {
	tb.Helper()
	dir := filepath.Join(rt.serviceDir(id), fmt.Sprint(node), "log")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	for _, l := range lines { // timestamp, severity, message
		fmt.Fprintf(f, `{"timestamp":"%s","user":"tsdbadmin","dbname":"tsdb","pid":4242,"session_id":"6b023b2a.6c30","line_num":1,"txid":0,"error_severity":"%s","message":"%s","backend_type":"client backend","query_id":0}`+"\n",
			l[0], l[1], l[2])
	}
}

func newLogRuntime(t *testing.T) *Runtime {
	t.Helper()
	return &Runtime{cfg: Config{DataDir: t.TempDir()}}
}

func TestRuntime_readLogs(t *testing.T) {
	rt := newLogRuntime(t)
	svc := &dbcloud.Service{ID: "svc1"}
	writeLog(t, rt, "svc1", 0, "postgresql-2026-11-21_231917.json",
		[3]string{"2026-11-21 23:19:17.001 UTC", "LOG", "primary one"},
		[3]string{"2026-11-21 23:19:17.003 UTC", "WARNING", "primary two"})
	writeLog(t, rt, "svc1", 1, "postgresql-2026-11-21_231917.json",
		[3]string{"2026-11-21 23:19:17.002 UTC", "ERROR", "replica one"})
	// Not instance directories.
	os.MkdirAll(filepath.Join(rt.serviceDir("svc1"), "tls"), 0o700)
	os.MkdirAll(filepath.Join(rt.serviceDir("svc1"), "01"), 0o700)
	ctx := context.Background()
	node := func(n int) *int { return &n }
	messages := func(p *dbcloud.LogPage) string {
		var m []string
		for _, e := range p.Entries {
			m = append(m, e.Severity+" "+e.Message)
		}
		return strings.Join(m, ", ")
	}
	tests := []struct {
		name string
		q    dbcloud.LogQuery
		want string
	}{
		{"AllNodes", dbcloud.LogQuery{}, "WARNING primary two, ERROR replica one, LOG primary one"},
		{"Node0", dbcloud.LogQuery{Node: node(0)}, "WARNING primary two, LOG primary one"},
		{"Node1", dbcloud.LogQuery{Node: node(1)}, "ERROR replica one"},
		{"NodeWithoutDir", dbcloud.LogQuery{Node: node(2)}, ""},
		{"Filters", dbcloud.LogQuery{Severities: []string{"error", "log"}, Search: []string{"ONE"}}, "ERROR replica one, LOG primary one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := rt.readLogs(ctx, svc, tt.q)
			if err != nil {
				t.Fatal(err)
			}
			if got := messages(p); got != tt.want || p.Cursor != "" {
				t.Errorf("got %q, cursor %q; want %q, none", got, p.Cursor, tt.want)
			}
		})
	}

	t.Run("Entry", func(t *testing.T) {
		p, err := rt.readLogs(ctx, svc, dbcloud.LogQuery{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		want := dbcloud.LogEntry{Timestamp: time.Date(2026, 11, 21, 23, 19, 17, 3e6, time.UTC), Severity: "WARNING", Message: "primary two"}
		if len(p.Entries) != 1 || p.Entries[0] != want || p.Cursor == "" {
			t.Errorf("got %+v, cursor %q; want %+v and a cursor", p.Entries, p.Cursor, want)
		}
	})

	t.Run("CursorSurvivesRestart", func(t *testing.T) {
		p, err := rt.readLogs(ctx, svc, dbcloud.LogQuery{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		// A new runtime (a restart): the key comes from the file.
		p, err = (&Runtime{cfg: rt.cfg}).readLogs(ctx, svc, dbcloud.LogQuery{Limit: 5, Cursor: p.Cursor})
		if err != nil {
			t.Fatal(err)
		}
		if got := messages(p); got != "ERROR replica one, LOG primary one" {
			t.Errorf("second page after a restart: %q", got)
		}
		fi, err := os.Stat(filepath.Join(rt.cfg.DataDir, cursorKeyFile))
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
			t.Errorf("cursor key file: %v, %v; want 32 bytes, mode 0600", fi, err)
		}
	})

	t.Run("ErrCursorOfOtherScope", func(t *testing.T) {
		p, err := rt.readLogs(ctx, svc, dbcloud.LogQuery{Limit: 1, Node: node(0)})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			name string
			svc  *dbcloud.Service
			q    dbcloud.LogQuery
		}{
			{"AllNodes", svc, dbcloud.LogQuery{Cursor: p.Cursor}},
			{"OtherNode", svc, dbcloud.LogQuery{Cursor: p.Cursor, Node: node(1)}},
			{"OtherService", &dbcloud.Service{ID: "svc2"}, dbcloud.LogQuery{Cursor: p.Cursor, Node: node(0)}},
		} {
			_, err := rt.readLogs(ctx, tt.svc, tt.q)
			if dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
				t.Errorf("%s: err = %v, want invalid", tt.name, err)
			}
		}
	})
}

func TestLoadCursorKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, cursorKeyFile)
	k1, err := loadCursorKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := loadCursorKey(path)
	if err != nil || string(k1) != string(k2) || len(k1) != 32 {
		t.Errorf("second load = %x, %v; want the same 32 bytes %x", k2, err, k1)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d files, want only the key", len(ents))
	}
	t.Run("ErrShortKey", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), cursorKeyFile)
		os.WriteFile(path, []byte("short"), 0o600)
		if _, err := loadCursorKey(path); err == nil || !strings.Contains(err.Error(), "5 bytes") {
			t.Errorf("err = %v, want one naming the wrong size", err)
		}
	})
}

func TestRuntime_PruneLogs(t *testing.T) {
	rt := newLogRuntime(t)
	old := time.Now().Add(-8 * 24 * time.Hour)
	for _, id := range []string{"a", "b"} {
		for n := range 2 {
			for _, name := range []string{"postgresql-2026-11-01_000000.json", "postgresql-2026-11-02_000000.json", "postgresql-2026-11-30_000000.json"} {
				writeLog(t, rt, id, n, name, [3]string{"2026-11-01 00:00:00.000 UTC", "LOG", "x"})
				if !strings.Contains(name, "11-30") {
					os.Chtimes(filepath.Join(rt.serviceDir(id), fmt.Sprint(n), "log", name), old, old)
				}
			}
		}
	}
	removed, err := rt.PruneLogs(context.Background(), LogRetention{})
	if err != nil {
		t.Fatal(err)
	}
	if removed != 8 {
		t.Errorf("removed %d files, want 8 (two older than 7 days in each of 4 instances)", removed)
	}
	left, _ := filepath.Glob(filepath.Join(rt.cfg.DataDir, "services", "*", "*", "log", "*.json"))
	if len(left) != 4 {
		t.Errorf("left %v, want the newest file of each instance", left)
	}
	t.Run("ErrCanceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := rt.PruneLogs(ctx, LogRetention{}); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}

func TestLogRetention_withDefaults(t *testing.T) {
	got := LogRetention{MaxBytes: 5}.withDefaults()
	want := LogRetention{MaxAge: 7 * 24 * time.Hour, MaxBytes: 5, Every: 30 * time.Second}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
