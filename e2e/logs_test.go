package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

type logsResponse struct {
	Logs    []string `json:"logs"`
	Entries []struct {
		Message   string `json:"message"`
		Severity  string `json:"severity"`
		Timestamp string `json:"timestamp"`
	} `json:"entries"`
	LastCursor      string `json:"lastCursor"`
	LastCursorSnake string `json:"last_cursor"`
	Code            string `json:"code"`
	Message         string `json:"message"`
}

// logs reads one page of a service's logs and checks what every page
// promises: at most 500 entries, logs[i] renders entries[i], newest first,
// and both cursor names carry the same value.
func (s *server) logs(id string, params url.Values) (logsResponse, int) {
	s.t.Helper()
	var l logsResponse
	code := s.call("GET", s.services()+"/"+id+"/logs?"+params.Encode(), nil, &l)
	if code != 200 {
		return l, code
	}
	if len(l.Entries) > 500 || len(l.Logs) != len(l.Entries) {
		s.t.Fatalf("page of %d entries and %d logs; want the same number, at most 500", len(l.Entries), len(l.Logs))
	}
	if l.LastCursor != l.LastCursorSnake {
		s.t.Fatalf("lastCursor %q and last_cursor %q differ", l.LastCursor, l.LastCursorSnake)
	}
	for i, e := range l.Entries {
		if want := e.Timestamp + " [" + e.Severity + "] " + e.Message; l.Logs[i] != want {
			s.t.Fatalf("logs[%d] = %q, want %q", i, l.Logs[i], want)
		}
	}
	return l, code
}

// waitLogs polls until the logs matching params hold at least n entries:
// the logging collector writes a line a moment after the statement.
func (s *server) waitLogs(id string, params url.Values, n int) logsResponse {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, code := s.logs(id, params)
		if code == 200 && len(l.Entries) >= n {
			return l
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("logs?%s: %d, %d entries after 20 s; want %d (%s)", params.Encode(), code, len(l.Entries), n, l.Message)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rotateLogs makes the instance's logging collector switch to a new file,
// as pg_rotate_logfile() does (a superuser function the test cannot call
// over TLS as tsdbadmin): it leaves the logrotate signal file in the data
// directory and sends SIGUSR1 to the postmaster, by its PID. File names
// have a resolution of one second, so it retries until a new file is there.
func (s *server) rotateLogs(id string) {
	s.t.Helper()
	inst := filepath.Join(s.dir, "runtime", "services", id, "0")
	before, _ := filepath.Glob(filepath.Join(inst, "log", "*.json"))
	raw, err := os.ReadFile(filepath.Join(inst, "pgdata", "postmaster.pid"))
	if err != nil {
		s.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(raw), "\n", 2)[0])
	if err != nil {
		s.t.Fatal(err)
	}
	for try := 0; try < 10; try++ {
		if err := os.WriteFile(filepath.Join(inst, "pgdata", "logrotate"), nil, 0o644); err != nil {
			s.t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			s.t.Fatal(err)
		}
		for wait := time.Now().Add(1100 * time.Millisecond); time.Now().Before(wait); {
			time.Sleep(50 * time.Millisecond)
			if after, _ := filepath.Glob(filepath.Join(inst, "log", "*.json")); len(after) > len(before) {
				return
			}
		}
	}
	s.t.Fatalf("no new log file in %s after 10 rotations", filepath.Join(inst, "log"))
}

// raiseWarnings logs n WARNING lines 'prefix i' from one DO block.
func raiseWarnings(ctx context.Context, db *pgx.Conn, prefix string, from, n int) error {
	_, err := db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN FOR i IN %d..%d LOOP RAISE WARNING '%s %%', i; END LOOP; END $$`, from, from+n-1, prefix))
	return err
}

func TestLogs(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "logs", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	id := svc.ServiceID
	db := s.mustConnect(svc, created.InitialPassword)
	marker := fmt.Sprintf("mk%x", time.Now().UnixNano())
	warning := "found " + marker + " here" // the one line with this text

	t.Run("WarningBySearchAndSeverity", func(t *testing.T) {
		// The log's timestamps have millisecond precision.
		before := time.Now().Truncate(time.Millisecond)
		if _, err := db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE WARNING '%s'; END $$`, warning)); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		l := s.waitLogs(id, url.Values{"search": {strings.ToUpper(marker)}, "severities": {"warning"}}, 1)
		if len(l.Entries) != 1 || l.Entries[0].Severity != "WARNING" || l.Entries[0].Message != warning || l.LastCursor != "" {
			t.Errorf("search for the marker: %+v, cursor %q; want the one WARNING, no cursor", l.Entries, l.LastCursor)
		}
		if ts, err := time.Parse(time.RFC3339Nano, l.Entries[0].Timestamp); err != nil || ts.Before(before) || ts.After(after) {
			t.Errorf("timestamp %q: %v, want the moment of the statement, between %v and %v", l.Entries[0].Timestamp, err, before, after)
		}
		// The same marker with another severity is not there.
		if l, _ := s.logs(id, url.Values{"search": {marker}, "severities": {"ERROR"}}); len(l.Entries) != 0 {
			t.Errorf("search with severity ERROR: %v, want none", l.Logs)
		}
	})

	t.Run("StatementError", func(t *testing.T) {
		table := "no_such_table_" + marker
		if _, err := db.Exec(ctx, "SELECT * FROM "+table); err == nil {
			t.Fatal("the statement did not fail")
		}
		l := s.waitLogs(id, url.Values{"search": {table}}, 1)
		if e := l.Entries[0]; e.Severity != "ERROR" || e.Message != `relation "`+table+`" does not exist` {
			t.Errorf("the failed statement: %+v, want ERROR relation ... does not exist", e)
		}
	})

	// More than 2,000 lines over two files, paged while a writer adds
	// lines and the collector rotates: each line present at the first page
	// comes exactly once, newest first; lines of the writer come as a
	// prefix of what it wrote (all those before the first page, none after).
	const batch = 2400
	if err := raiseWarnings(ctx, db, "page-"+marker+" batch", 0, batch/2); err != nil {
		t.Fatal(err)
	}
	s.rotateLogs(id)
	if err := raiseWarnings(ctx, db, "page-"+marker+" batch", batch/2, batch/2); err != nil {
		t.Fatal(err)
	}
	s.waitLogs(id, url.Values{"search": {fmt.Sprintf("page-%s batch %d", marker, batch-1)}}, 1)
	for _, tt := range []struct {
		name   string
		params url.Values
	}{
		{"PagingAll", url.Values{}},
		{"PagingSearch", url.Values{"search": {"PAGE-" + marker}, "severities": {"WARNING", "log"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			live := "live" + tt.name // the writer's lines, new for each run
			line := regexp.MustCompile(`^page-` + marker + ` (batch|` + live + `) (\d+)$`)
			writer := s.mustConnect(svc, created.InitialPassword)
			wctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			var total int // lines the writer wrote, read after wg.Wait
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; wctx.Err() == nil; i++ {
					if raiseWarnings(wctx, writer, "page-"+marker+" "+live, i*5, 5) == nil {
						total = i*5 + 5
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
			defer func() { stop(); wg.Wait() }()
			// Some of the writer's lines come before the first page.
			s.waitLogs(id, url.Values{"search": {fmt.Sprintf("page-%s %s 49", marker, live)}}, 1)
			params := tt.params
			seen := map[string]int{}
			lastBatch := batch
			pages := 0
			for {
				l, code := s.logs(id, params)
				if code != 200 {
					t.Fatalf("page %d: %d %s", pages+1, code, l.Message)
				}
				pages++
				for _, e := range l.Entries {
					m := line.FindStringSubmatch(e.Message)
					if m == nil {
						continue
					}
					seen[m[1]+" "+m[2]]++
					if m[1] == "batch" {
						n, _ := strconv.Atoi(m[2])
						if n >= lastBatch {
							t.Fatalf("batch line %d after line %d: not newest first", n, lastBatch)
						}
						lastBatch = n
					}
				}
				if l.LastCursor == "" {
					break
				}
				if len(l.Entries) != 500 {
					t.Fatalf("page %d has %d entries and a cursor; want 500", pages, len(l.Entries))
				}
				params = url.Values{"cursor": {l.LastCursor}}
				for k, v := range tt.params {
					params[k] = v
				}
				if pages == 2 {
					s.rotateLogs(id)
				}
			}
			stop()
			wg.Wait()
			for i := range batch {
				if n := seen["batch "+strconv.Itoa(i)]; n != 1 {
					t.Errorf("batch line %d came %d times, want once", i, n)
				}
			}
			written := 0
			for ; seen[live+" "+strconv.Itoa(written)] == 1; written++ {
			}
			for k, n := range seen {
				if rest, ok := strings.CutPrefix(k, live+" "); ok {
					if i, _ := strconv.Atoi(rest); i >= written || n != 1 {
						t.Errorf("writer line %s came %d times; want each of the first %d once, no later one", k, n, written)
					}
				}
			}
			if pages < 5 {
				t.Errorf("%d pages, want at least 5 (%d lines)", pages, batch)
			}
			if total <= written {
				t.Errorf("the writer wrote %d lines, all before the first page; want some while paging", total)
			}
			t.Logf("%d pages; the writer wrote %d lines, the first %d of them before the first page", pages, total, written)
		})
	}

	t.Run("BadRequests", func(t *testing.T) {
		first, _ := s.logs(id, url.Values{"search": {"page-" + marker}})
		if first.LastCursor == "" {
			t.Fatal("no cursor")
		}
		tampered := []byte(first.LastCursor)
		tampered[len(tampered)/2] ^= 1
		for _, tt := range []struct {
			name   string
			params url.Values
			phrase string
		}{
			{"Cursor", url.Values{"cursor": {"garbage"}}, "cursor"},
			{"TamperedCursor", url.Values{"cursor": {string(tampered)}}, "cursor"},
			{"CursorOfOtherNode", url.Values{"cursor": {first.LastCursor}, "node": {"0"}}, "cursor"},
			{"Since", url.Values{"since": {"yesterday"}}, "since"},
			{"Until", url.Values{"until": {"2026-13-01T00:00:00Z"}}, "until"},
			{"SinceAfterUntil", url.Values{"since": {"2026-01-02T00:00:00Z"}, "until": {"2026-01-01T00:00:00Z"}}, "since"},
			{"Node", url.Values{"node": {"x"}}, "node"},
			{"NodeAbsent", url.Values{"node": {"1"}}, "node"},
			{"Severity", url.Values{"severities": {"WARN"}}, "severity"},
		} {
			l, code := s.logs(id, tt.params)
			if code != 400 || !strings.Contains(strings.ToLower(l.Message), tt.phrase) {
				t.Errorf("%s: %d %s %q; want 400 saying what was wrong (%q)", tt.name, code, l.Code, l.Message, tt.phrase)
			}
		}
		if l, code := s.logs(id, url.Values{"node": {"0"}, "search": {warning}, "severities": {"WARNING"}}); code != 200 || len(l.Entries) != 1 {
			t.Errorf("node 0: %d, %d entries; want the warning", code, len(l.Entries))
		}
	})

	t.Run("PausedAndRestarted", func(t *testing.T) {
		params := url.Values{"search": {"page-" + marker + " batch"}}
		first, _ := s.logs(id, params)
		if code := s.call("POST", s.services()+"/"+id+"/stop", nil, nil); code != 202 {
			t.Fatalf("stop: %d", code)
		}
		s.waitStatus(id, "PAUSED", 30*time.Second)
		l, code := s.logs(id, url.Values{"search": {warning}, "severities": {"WARNING"}})
		if code != 200 || len(l.Entries) != 1 {
			t.Errorf("while PAUSED: %d, %d entries; want the warning", code, len(l.Entries))
		}
		second, _ := s.logs(id, url.Values{"search": params["search"], "cursor": {first.LastCursor}})
		s.restart()
		// A cursor made before the restart reads the same page after it.
		again, code := s.logs(id, url.Values{"search": params["search"], "cursor": {first.LastCursor}})
		if code != 200 || len(again.Logs) != 500 || strings.Join(again.Logs, "\n") != strings.Join(second.Logs, "\n") {
			t.Errorf("second page after a restart: %d, %d entries; want the %d of before", code, len(again.Logs), len(second.Logs))
		}
		if l, _ := s.logs(id, url.Values{"search": {warning}, "severities": {"WARNING"}}); len(l.Entries) != 1 {
			t.Errorf("after a restart: %d entries, want the warning", len(l.Entries))
		}
	})

	t.Run("DeletedWithService", func(t *testing.T) {
		logDir := filepath.Join(s.dir, "runtime", "services", id, "0", "log")
		if files, _ := filepath.Glob(filepath.Join(logDir, "*.json")); len(files) < 3 {
			t.Errorf("log files %v, want at least 3 (two rotations)", files)
		}
		if code := s.call("DELETE", s.services()+"/"+id, nil, nil); code != 202 {
			t.Fatalf("delete: %d", code)
		}
		s.waitGone(id, 30*time.Second)
		if _, err := os.Stat(logDir); !os.IsNotExist(err) {
			t.Errorf("log directory remains: %v", err)
		}
		if _, code := s.logs(id, url.Values{}); code != 404 {
			t.Errorf("logs of a deleted service: %d, want 404", code)
		}
	})
}

// TestLogs_NoHostPath: the lines a tenant reads name no host path. A
// started instance logs the Unix socket it listens on (in the service's
// directory under the runtime directory), and a text search dictionary
// whose file is missing the file it looked for (in PostgreSQL's share
// directory): both come back with neutral names, and a search for a host
// path finds nothing.
func TestLogs_NoHostPath(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "paths", "cpu_millis": "shared"})
	svc := s.waitStatus(created.ServiceID, "READY", 60*time.Second)
	id := svc.ServiceID
	db := s.mustConnect(svc, created.InitialPassword)
	if _, err := db.Exec(ctx, `CREATE TEXT SEARCH DICTIONARY paths (TEMPLATE = ispell, DictFile = dbcloud_no_such_dict, AffFile = dbcloud_no_such_dict)`); err == nil {
		t.Fatal("a dictionary with a missing file was created")
	}
	// Both lines are there before the check, whatever they show.
	s.waitLogs(id, url.Values{"search": {"Unix socket"}}, 1)
	s.waitLogs(id, url.Values{"search": {"dbcloud_no_such_dict"}, "severities": {"ERROR"}}, 1)

	var hostPaths []string
	for _, p := range []string{s.dir, s.runtimeDir(), "/usr/lib/postgresql", "/usr/share/postgresql"} {
		hostPaths = append(hostPaths, p)
		if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
			hostPaths = append(hostPaths, real)
		}
	}
	var all []string
	for params := (url.Values{}); ; {
		l, code := s.logs(id, params)
		if code != 200 {
			t.Fatalf("logs: %d %s", code, l.Message)
		}
		for _, e := range l.Entries {
			all = append(all, e.Message)
		}
		if l.LastCursor == "" {
			break
		}
		params = url.Values{"cursor": {l.LastCursor}}
	}
	named := 0
	for _, m := range all {
		for _, p := range hostPaths {
			if strings.Contains(m, p) {
				t.Errorf("a log line names host path %s: %q", p, m)
			}
		}
		if strings.Contains(m, "<service>") || strings.Contains(m, "<postgresql-share>") {
			named++
		}
	}
	if named < 2 {
		t.Errorf("%d of %d lines name <service> or <postgresql-share>; want at least the socket and the dictionary file:\n%s",
			named, len(all), strings.Join(all, "\n"))
	}
	for _, p := range hostPaths[:2] {
		if l, code := s.logs(id, url.Values{"search": {p}}); code != 200 || len(l.Entries) != 0 {
			t.Errorf("search for host path %s: %d, %d entries; want 200 and none", p, code, len(l.Entries))
		}
	}
}
