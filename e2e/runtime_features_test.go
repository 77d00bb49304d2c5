package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// TestRuntime_Pooler enables a service's pooler through the API, runs
// transactions through its endpoint over TLS from several clients at once
// (a rolled-back one leaves nothing), finds their rows through the
// service's endpoint, and disables it: the endpoint goes from the API and
// stops accepting connections; on Kubernetes CNPG's Pooler, its pods and
// the Service exposing it are gone. TestPooler_ManyClients is the local
// runtime's PgBouncer under load.
func TestRuntime_Pooler(t *testing.T) {
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "pooled"})
	id, pw := created.ServiceID, created.InitialPassword
	svc := s.waitStatus(id, "READY", readyWithin())
	direct := s.mustConnect(svc, pw)
	defer direct.Close(ctx)
	if _, err := direct.Exec(ctx, "CREATE TABLE pooled (client int, n int)"); err != nil {
		t.Fatal(err)
	}

	began := time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/enablePooler", nil, nil); code != 200 {
		t.Fatalf("enablePooler: %d", code)
	}
	addr := s.waitPooler(id, true, readyWithin())
	t.Logf("enablePooler to its endpoint %s shown: %.1f s", addr, time.Since(began).Seconds())

	const clients, txs = 4, 10
	errs := make(chan error, clients)
	for i := range clients {
		go func() { errs <- s.pooledTransactions(addr, pw, i, txs) }()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if onKubernetes() {
		s.checkThroughPgBouncer(kubeClient(t), id, addr, pw)
	}
	var rows int
	if err := direct.QueryRow(ctx, "SELECT count(*) FROM pooled").Scan(&rows); err != nil || rows != clients*txs {
		t.Fatalf("%d rows (%v) through the service's endpoint after %d clients' %d committed transactions each; want %d",
			rows, err, clients, txs, clients*txs)
	}

	if code := s.call("POST", s.services()+"/"+id+"/disablePooler", nil, nil); code != 200 {
		t.Fatalf("disablePooler: %d", code)
	}
	s.waitPooler(id, false, readyWithin())
	waitLoginsRefused(t, "the pooler's endpoint "+addr+" after disablePooler", func(ctx context.Context) (*pgx.Conn, error) {
		return pgx.Connect(ctx, s.poolerDSN(addr, pw))
	})
	if onKubernetes() {
		s.checkPoolerGone(kubeClient(t), id, readyWithin())
	}
	s.waitSettled(id, readyWithin())
}

// waitLoginsRefused waits, up to readyWithin, until connect fails: what
// names the endpoint that must stop accepting logins.
func waitLoginsRefused(t *testing.T, what string, connect func(context.Context) (*pgx.Conn, error)) {
	t.Helper()
	for deadline := time.Now().Add(readyWithin()); ; time.Sleep(500 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := connect(ctx)
		cancel()
		if err != nil {
			return
		}
		c.Close(context.Background())
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts logins %v later", what, readyWithin())
		}
	}
}

// pooledTransactions runs txs transactions as one client through the
// pooler at addr: each inserts a row and commits, and one more inserts a
// row and rolls back. The connection must be TLS.
func (s *server) pooledTransactions(addr, password string, client, txs int) error {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.poolerDSN(addr, password))
	if err != nil {
		return fmt.Errorf("client %d through the pooler %s: %w", client, addr, err)
	}
	defer c.Close(ctx)
	if _, ok := c.PgConn().Conn().(*tls.Conn); !ok {
		return fmt.Errorf("client %d: the pooler's connection is not TLS", client)
	}
	for n := range txs {
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO pooled VALUES ($1, $2)", client, n)
			return err
		})
		if err != nil {
			return fmt.Errorf("client %d, transaction %d: %w", client, n, err)
		}
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO pooled VALUES ($1, -1)", client); err != nil {
		return err
	}
	return tx.Rollback(ctx)
}

// checkThroughPgBouncer checks that a session through the pooler's
// endpoint reaches PostgreSQL from one of CNPG's PgBouncer pods of the
// service's Pooler, not from the client or another path.
func (s *server) checkThroughPgBouncer(kc client.Client, id, addr, password string) {
	s.t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	if err := kc.List(ctx, &pods, client.InNamespace(s.kubeNamespace()),
		client.MatchingLabels{"cnpg.io/poolerName": kubernetes.PoolerName(kubeCluster(id))}); err != nil {
		s.t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, s.poolerDSN(addr, password))
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close(ctx)
	var from string
	if err := c.QueryRow(ctx, "SELECT coalesce(host(inet_client_addr()), 'a socket')").Scan(&from); err != nil {
		s.t.Fatal(err)
	}
	var ips []string
	for _, p := range pods.Items {
		if p.Status.PodIP == from {
			return
		}
		ips = append(ips, p.Status.PodIP)
	}
	s.t.Fatalf("a session through the pooler %s reaches PostgreSQL from %s, not from a PgBouncer pod of the Pooler (%v)", addr, from, ips)
}

// checkPoolerGone polls until the service's Pooler, its PgBouncer pods and
// the Service exposing it are gone from the namespace.
func (s *server) checkPoolerGone(kc client.Client, id string, within time.Duration) {
	s.t.Helper()
	ctx := context.Background()
	ns, name := s.kubeNamespace(), kubernetes.PoolerName(kubeCluster(id))
	for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
		var left []string
		for _, o := range []struct {
			obj  client.Object
			name string
		}{{&apiv1.Pooler{}, name}, {&corev1.Service{}, name}, {&corev1.Service{}, kubernetes.ExternalName(name)}} {
			err := kc.Get(ctx, client.ObjectKey{Namespace: ns, Name: o.name}, o.obj)
			if err == nil {
				left = append(left, fmt.Sprintf("%T %s", o.obj, o.name))
			} else if !apierrors.IsNotFound(err) {
				s.t.Fatal(err)
			}
		}
		var pods corev1.PodList
		if err := kc.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"cnpg.io/poolerName": name}); err != nil {
			s.t.Fatal(err)
		}
		for _, p := range pods.Items {
			left = append(left, "pod "+p.Name)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%v after disablePooler: %v", within, left)
		}
	}
}

// TestRuntime_ReplicaSet creates a read replica set of a service through
// the API: its endpoint serves the parent's rows from a standby, rows the
// parent writes later arrive, a write is refused as read-only (25006),
// and delete removes it from the API and its endpoint; on Kubernetes
// nothing of its replica Cluster is left. TestReplicaSets is the local
// runtime's nodes, slots and failover.
func TestRuntime_ReplicaSet(t *testing.T) {
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "parent"})
	parent := s.waitStatus(created.ServiceID, "READY", readyWithin())
	pw := created.InitialPassword
	pc := s.mustConnect(parent, pw)
	defer pc.Close(ctx)
	if _, err := pc.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}

	var rs replicaSet
	began := time.Now()
	if code := s.call("POST", s.replicaSets(parent.ServiceID), map[string]any{"name": "reads", "cpu_millis": 500, "memory_gbs": 2, "nodes": 1}, &rs); code != 202 {
		t.Fatalf("create replica set: %d %+v", code, rs)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "active", readyWithin())
	t.Logf("replica set create to active: %.1f s", time.Since(began).Seconds())
	set, code := s.get(rs.ID)
	if code != 200 || set.Status != "READY" {
		t.Fatalf("GET the set as a service: %d %+v", code, set)
	}
	nodesSeen(t, s, set, pw, 1, 100)
	rc := s.mustConnect(set, pw)
	_, err := rc.Exec(ctx, "INSERT INTO t VALUES (1000)")
	rc.Close(ctx)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25006" {
		t.Fatalf("write on the replica set's endpoint: %v, want SQLSTATE 25006 (read-only transaction)", err)
	}
	if _, err := pc.Exec(ctx, "INSERT INTO t SELECT generate_series(101, 200)"); err != nil {
		t.Fatal(err)
	}
	nodesSeen(t, s, set, pw, 1, 200)

	if code := s.call("DELETE", s.replicaSets(parent.ServiceID)+"/"+rs.ID, nil, nil); code != 202 {
		t.Fatalf("delete replica set: %d", code)
	}
	s.waitReplicaSet(parent.ServiceID, rs.ID, "gone", readyWithin())
	if _, code := s.get(rs.ID); code != 404 {
		t.Fatalf("GET the deleted set: %d, want 404", code)
	}
	waitLoginsRefused(t, "the deleted set's endpoint", func(ctx context.Context) (*pgx.Conn, error) {
		return s.connect(ctx, set, pw)
	})
	if onKubernetes() {
		cluster := kubernetes.ReplicaClusterName(&dbcloud.ReadReplicaSet{ID: rs.ID})
		s.checkGone(kubeClient(t), readyWithin(), func(o metav1.Object) bool {
			return strings.HasPrefix(o.GetName(), cluster) || o.GetLabels()["cnpg.io/cluster"] == cluster || o.GetLabels()[kubernetes.LabelReplicaSet] == rs.ID
		})
	}
}

// TestRuntime_PGVersions creates a service on PostgreSQL 17 and one on 15
// through the API only, so it runs on every runtime (on Kubernetes, in pods
// of each version's image): each server and the service's metadata say its
// version; on 17 tsdbadmin connects over TLS, the addons' TimescaleDB and
// pgvector work, and dbcloud_guard is loaded and refuses what it reserves.
func TestRuntime_PGVersions(t *testing.T) {
	parallelOnLocal(t)
	if !onKubernetes() {
		requirePGVersion(t, 17)
	}
	s := newServer(t)
	ctx := context.Background()
	began := time.Now()
	svc, pw := s.createOn(t, 17, []string{"time-series", "ai"})
	t.Logf("create to READY on 17: %.1f s", time.Since(began).Seconds())
	db := s.mustConnect(svc.service, pw)
	if got := queryValues(t, db, `SELECT current_user || ' ' || ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`); len(got) != 1 || got[0] != "tsdbadmin true" {
		t.Errorf("session on 17: %q, want tsdbadmin over TLS", got)
	}
	checkHypertableAndVector(t, db)
	// A setting the guard defines exists only where the library is loaded
	// (shared_preload_libraries itself is not readable by tsdbadmin on
	// every runtime).
	if got := queryValues(t, db, `SELECT coalesce(current_setting('dbcloud_guard.storage_read_only', true), 'not defined')`); len(got) != 1 || got[0] != "off" {
		t.Errorf("dbcloud_guard.storage_read_only on 17: %q, want off (the guard loaded)", got)
	}
	// PostgreSQL refuses ALTER SYSTEM to non-superusers too, with another
	// message: this one is the guard's.
	if _, err := db.Exec(ctx, `ALTER SYSTEM SET work_mem = '1MB'`); err == nil || !strings.Contains(err.Error(), "ALTER SYSTEM is not allowed on this service") {
		t.Errorf("ALTER SYSTEM as tsdbadmin on 17: %v, want the guard's refusal", err)
	}
	if onKubernetes() {
		pods := s.instancePods(kubeClient(t), svc.ServiceID)
		if len(pods) == 0 {
			t.Errorf("no instance pod of %s", svc.ServiceID)
		}
		for _, p := range pods {
			for _, c := range p.Spec.Containers {
				if c.Name == "postgres" && !strings.HasSuffix(c.Image, ":17") {
					t.Errorf("pod %s runs %s, want the 17 image", p.Name, c.Image)
				}
			}
		}
	}
	began = time.Now()
	s.createOn(t, 15, nil)
	t.Logf("create to READY on 15 beside it: %.1f s", time.Since(began).Seconds())
}
