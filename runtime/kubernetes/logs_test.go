package kubernetes_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// podLogs serves canned pod logs: there is no kubelet to produce real ones.
type podLogs map[string][]string

func (p podLogs) PodLogs(_ context.Context, _, pod string, _ *time.Time) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(strings.Join(p[pod], "\n") + "\n")), nil
}

// record is a line as CNPG's instance manager writes a PostgreSQL jsonlog
// record (docs/src/logging.md).
func record(ts time.Time, severity, msg string) string {
	return fmt.Sprintf(`{"level":"info","ts":"%s","logger":"postgres","msg":"record","logging_pod":"x","record":{"log_time":"%s","error_severity":"%s","message":%q}}`,
		ts.Format(time.RFC3339Nano), ts.UTC().Format("2006-01-02 15:04:05.000 MST"), severity, msg)
}

func TestLogs(t *testing.T) {
	base := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvProd, Replicas: 1, Running: true})
	name := kubernetes.ClusterName(svc)
	logs := podLogs{
		name + "-1": {
			record(base.Add(1*time.Second), "LOG", "database system is ready to accept connections"),
			`{"level":"info","ts":"x","logger":"instance-manager","msg":"not a postgres record"}`,
			record(base.Add(3*time.Second), "ERROR", "relation \"t\" does not exist"),
		},
		name + "-2": {record(base.Add(2*time.Second), "LOG", "started streaming WAL")},
	}
	rt := newRuntime(t, kubernetes.Config{Logs: logs})
	ctx := testContext(t)
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 2))

	page, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != 2 || page.Entries[0].Severity != "ERROR" || page.Entries[1].Message != "started streaming WAL" || page.Cursor == "" {
		t.Fatalf("first page %+v", page)
	}
	next, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 2, Cursor: page.Cursor})
	if err != nil {
		t.Fatal(err)
	}
	if len(next.Entries) != 1 || !strings.Contains(next.Entries[0].Message, "ready to accept") || next.Cursor != "" {
		t.Fatalf("second page %+v", next)
	}
	node := 1
	only, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 10, Node: &node})
	if err != nil || len(only.Entries) != 1 || only.Entries[0].Message != "started streaming WAL" {
		t.Fatalf("node 1: %+v, %v", only, err)
	}
	found, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 10, Severities: []string{"ERROR"}, Search: []string{"RELATION"}})
	if err != nil || len(found.Entries) != 1 {
		t.Fatalf("search: %+v, %v", found, err)
	}
	if _, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 10, Cursor: "garbage"}); dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
		t.Fatalf("bad cursor: %v", err)
	}
	other := 0
	if _, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 10, Cursor: page.Cursor, Node: &other}); dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid ||
		!strings.Contains(err.Error(), "node filter") {
		t.Fatalf("a cursor of all nodes read for node 0: %v", err)
	}
	if _, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Severities: []string{"LOUD"}}); dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
		t.Fatalf("unknown severity: %v", err)
	}
	all, err := rt.Logs(ctx, svc, dbcloud.LogQuery{})
	if err != nil || len(all.Entries) != 3 || all.Cursor != "" {
		t.Fatalf("no limit (the local runtime's page size): %+v %v", all, err)
	}
	since, until := base.Add(1*time.Second), base.Add(3*time.Second)
	if mid, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Since: &since, Until: &until}); err != nil || len(mid.Entries) != 1 ||
		mid.Entries[0].Message != "started streaming WAL" {
		t.Fatalf("since and until are exclusive: %+v %v", mid, err)
	}
}

// TestLogCursorsSameMillisecond: PostgreSQL writes milliseconds, so
// entries share timestamps within a node and across nodes. Paging one
// entry at a time returns every entry exactly once, newest first, as the
// local runtime's cursors do.
func TestLogCursorsSameMillisecond(t *testing.T) {
	base := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvProd, Replicas: 1, Running: true})
	name := kubernetes.ClusterName(svc)
	same := base.Add(time.Second)
	logs := podLogs{
		name + "-1": {record(base, "LOG", "p0"), record(same, "LOG", "p1"), record(same, "LOG", "p2"), record(same, "WARNING", "p3")},
		name + "-2": {record(same, "LOG", "r1"), record(same, "LOG", "r2"), record(base.Add(2*time.Second), "LOG", "r3")},
	}
	rt := newRuntime(t, kubernetes.Config{Logs: logs})
	ctx := testContext(t)
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 2))
	walk := func(q dbcloud.LogQuery) []string {
		t.Helper()
		var got []string
		for i := 0; ; i++ {
			page, err := rt.Logs(ctx, svc, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.Entries {
				got = append(got, e.Message)
			}
			if page.Cursor == "" {
				return got
			}
			if i > 20 {
				t.Fatalf("no end after %v", got)
			}
			q.Cursor = page.Cursor
		}
	}
	// Newest first; within a millisecond the primary (node 0) first, and
	// each node's later line first.
	want := "r3 p3 p2 p1 r2 r1 p0"
	for _, limit := range []int{1, 2, 3} {
		if got := strings.Join(walk(dbcloud.LogQuery{Limit: limit}), " "); got != want {
			t.Errorf("pages of %d: %s, want %s", limit, got, want)
		}
	}
	// Filters apply before paging, and the positions hold under them.
	if got := strings.Join(walk(dbcloud.LogQuery{Limit: 1, Severities: []string{"log"}}), " "); got != "r3 p2 p1 r2 r1 p0" {
		t.Errorf("LOG only: %s", got)
	}
}
