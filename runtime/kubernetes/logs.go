package kubernetes

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

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
// newest first, with the local runtime's filters. Node 0 is the current
// primary, then the others by name. The cursor is the timestamp of the
// last entry returned; the next page holds older entries. Kubernetes keeps
// only the current and previous container's log, so older lines are gone.
func (rt *Runtime) Logs(ctx context.Context, svc *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	page := &dbcloud.LogPage{}
	if rt.cfg.Logs == nil {
		return page, nil
	}
	ns := rt.Namespace(svc.ProjectID)
	var c apiv1.Cluster
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ClusterName(svc)}, &c); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	before := q.Until
	if q.Cursor != "" {
		t, err := time.Parse(time.RFC3339Nano, q.Cursor)
		if err != nil {
			return nil, dbcloud.Errorf(dbcloud.KindInvalid, "cursor is not one this service returned.")
		}
		if before == nil || t.Before(*before) {
			before = &t
		}
	}
	var all []dbcloud.LogEntry
	for node, inst := range instances(&c.Status) {
		if q.Node != nil && *q.Node != node {
			continue
		}
		entries, err := rt.podEntries(ctx, ns, inst.ID, q, before)
		if err != nil {
			return nil, err
		}
		all = append(all, entries...)
	}
	slices.SortStableFunc(all, func(a, b dbcloud.LogEntry) int { return b.Timestamp.Compare(a.Timestamp) })
	if len(all) > q.Limit && q.Limit > 0 {
		all = all[:q.Limit]
		page.Cursor = all[len(all)-1].Timestamp.Format(time.RFC3339Nano)
	}
	page.Entries = all
	return page, nil
}

func (rt *Runtime) podEntries(ctx context.Context, ns, pod string, q dbcloud.LogQuery, before *time.Time) ([]dbcloud.LogEntry, error) {
	r, err := rt.cfg.Logs.PodLogs(ctx, ns, pod, q.Since)
	if err != nil {
		return nil, fmt.Errorf("logs of pod %s: %w", pod, err)
	}
	defer r.Close()
	var out []dbcloud.LogEntry
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
		e := dbcloud.LogEntry{Timestamp: ts, Severity: l.Record.Severity, Message: l.Record.Message}
		if keep(e, q, before) {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

func keep(e dbcloud.LogEntry, q dbcloud.LogQuery, before *time.Time) bool {
	if q.Since != nil && !e.Timestamp.After(*q.Since) || before != nil && !e.Timestamp.Before(*before) {
		return false
	}
	if len(q.Severities) > 0 && !slices.ContainsFunc(q.Severities, func(s string) bool { return strings.EqualFold(s, e.Severity) }) {
		return false
	}
	msg := strings.ToLower(e.Message)
	for _, s := range q.Search {
		if !strings.Contains(msg, strings.ToLower(s)) {
			return false
		}
	}
	return true
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
