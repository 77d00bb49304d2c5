package kubernetes

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"dbcloud/pglog"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
)

// PodLogReader streams a container's log (the pod logs API).
type PodLogReader interface {
	PodLogs(ctx context.Context, ns, pod string, since *time.Time) (io.ReadCloser, error)
}

type podLogs struct{ cs kubernetes.Interface }

func newPodLogs(rc *rest.Config) (PodLogReader, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return podLogs{cs}, nil
}

func (p podLogs) PodLogs(ctx context.Context, ns, pod string, since *time.Time) (io.ReadCloser, error) {
	opts := &corev1.PodLogOptions{Container: "postgres"}
	if since != nil {
		opts.SinceTime = &metav1.Time{Time: *since}
	}
	return p.cs.CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
}

// cnpgLogLine is one line of a CNPG instance's log: the instance manager
// wraps each PostgreSQL jsonlog record (docs/src/logging.md).
type cnpgLogLine struct {
	Logger string `json:"logger"`
	Record struct {
		LogTime  string `json:"log_time"`
		Severity string `json:"error_severity"`
		Message  string `json:"message"`
	} `json:"record"`
}

// Logs reads the instances' PostgreSQL records through the pod logs API,
// with the local runtime's model (pglog): its filters (pglog.Matcher: the
// same severities, search folding and exclusive since/until), page size,
// newest first, and a cursor that is empty exactly when no older entry
// matches and never skips or repeats an entry. Node 0 is the current
// primary, then the others by name. Kubernetes keeps only the running
// container's log (and the previous one's, not read here), so entries
// older than the container are gone.
func (rt *Runtime) Logs(ctx context.Context, svc *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	m, err := pglog.NewMatcher(pglog.Query{Since: q.Since, Until: q.Until, Severities: q.Severities, Search: q.Search})
	if err != nil {
		return nil, err
	}
	// The node filter is part of the scope, as for the local runtime: a
	// position in one node's entries does not continue a read of all.
	scope := svc.ID + "/all"
	if q.Node != nil {
		scope = svc.ID + "/" + strconv.Itoa(*q.Node)
	}
	var after *logKey
	if q.Cursor != "" {
		if after, err = decodeLogCursor(scope, q.Cursor); err != nil {
			return nil, err
		}
	}
	page := &dbcloud.LogPage{}
	if rt.cfg.Logs == nil {
		return page, nil
	}
	ns := rt.Namespace(svc.ProjectID)
	var c apiv1.Cluster
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ClusterName(svc)}, &c); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	var all []keyedEntry
	for node, inst := range instances(&c.Status) {
		if q.Node != nil && *q.Node != node {
			continue
		}
		entries, err := rt.podEntries(ctx, ns, inst.ID, node, q.Since, m, after)
		if err != nil {
			return nil, err
		}
		all = append(all, entries...)
	}
	slices.SortFunc(all, func(a, b keyedEntry) int { return a.key.compare(b.key) })
	limit := q.Limit
	if limit <= 0 {
		limit = pglog.MaxEntries
	}
	if len(all) > limit {
		all = all[:limit]
		page.Cursor = encodeLogCursor(scope, all[len(all)-1].key)
	}
	for _, e := range all {
		page.Entries = append(page.Entries, e.entry)
	}
	return page, nil
}

// logKey places an entry in page order: newest first; among entries of
// one timestamp (PostgreSQL writes milliseconds), by node, then the later
// line first. Seq counts a node's records of the same timestamp in log
// order, before any filter, so a key means the same entry on every read
// while the container's log only grows.
type logKey struct {
	T    time.Time
	Node int
	Seq  int
}

// compare is negative when k comes before o in page order.
func (k logKey) compare(o logKey) int {
	if c := o.T.Compare(k.T); c != 0 {
		return c
	}
	if k.Node != o.Node {
		return k.Node - o.Node
	}
	return o.Seq - k.Seq
}

type keyedEntry struct {
	key   logKey
	entry dbcloud.LogEntry
}

// wireLogCursor is a cursor's payload: the scope it belongs to and the
// last entry's key. It names no file or offset, so unlike the local
// runtime's it needs no signature: an altered one can only point at
// another position in the same service's logs.
type wireLogCursor struct {
	V     int    `json:"v"`
	Scope string `json:"s"`
	T     int64  `json:"t"`
	Node  int    `json:"n"`
	Seq   int    `json:"q"`
}

const logCursorVersion = 1

func encodeLogCursor(scope string, k logKey) string {
	b, _ := json.Marshal(wireLogCursor{V: logCursorVersion, Scope: scope, T: k.T.UnixNano(), Node: k.Node, Seq: k.Seq}) // plain types
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeLogCursor refuses, with the local runtime's messages, what is not
// a cursor of this scope.
func decodeLogCursor(scope, cursor string) (*logKey, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	var w wireLogCursor
	if err != nil || json.Unmarshal(raw, &w) != nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor is malformed; pass lastCursor of a previous response unchanged.")
	}
	if w.V != logCursorVersion {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor comes from another version of this server; read again without a cursor.")
	}
	if w.Scope != scope {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor was not issued by this server for this service and node filter; pass lastCursor of a previous response unchanged, with the same node.")
	}
	return &logKey{T: time.Unix(0, w.T).UTC(), Node: w.Node, Seq: w.Seq}, nil
}

// podEntries reads one instance's records that m keeps and that come
// after the cursor's key in page order.
func (rt *Runtime) podEntries(ctx context.Context, ns, pod string, node int, since *time.Time, m *pglog.Matcher, after *logKey) ([]keyedEntry, error) {
	r, err := rt.cfg.Logs.PodLogs(ctx, ns, pod, since)
	if err != nil {
		return nil, fmt.Errorf("logs of pod %s: %w", pod, err)
	}
	defer r.Close()
	var out []keyedEntry
	var lastT time.Time
	seq := 0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l cnpgLogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Logger != "postgres" || l.Record.Message == "" {
			continue
		}
		ts, err := time.Parse("2006-01-02 15:04:05.999 MST", l.Record.LogTime)
		if err != nil {
			continue
		}
		ts = ts.UTC()
		if ts.Equal(lastT) {
			seq++
		} else {
			lastT, seq = ts, 0
		}
		k := logKey{T: ts, Node: node, Seq: seq}
		if after != nil && k.compare(*after) <= 0 {
			continue
		}
		e := pglog.Entry{Timestamp: ts, Severity: l.Record.Severity, Message: l.Record.Message}
		if m.Match(e) {
			out = append(out, keyedEntry{key: k, entry: dbcloud.LogEntry{Timestamp: ts, Severity: e.Severity, Message: e.Message}})
		}
	}
	return out, sc.Err()
}

// metaItems returns the items of a list as objects to delete.
func metaItems(list client.ObjectList) ([]client.Object, error) {
	objs, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		if co, ok := o.(client.Object); ok {
			out = append(out, co)
		}
	}
	return out, nil
}
