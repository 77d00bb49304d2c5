package e2e

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// The tests of this file run on both runtimes through the API; on
// Kubernetes they also look at the pods and objects CNPG made, through
// the run's kubeconfig, for what the API cannot show (a pod's resources,
// what a delete left in the namespace), and the failover test breaks the
// primary by deleting its pod.

// kubeClient is a client of the run's cluster, with CNPG's types.
func kubeClient(t testing.TB) client.Client {
	t.Helper()
	rc, err := kubernetes.RESTConfig(*e2eKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := kubernetes.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// kubeNamespace and kubeCluster are where the runtime puts a service.
func (s *server) kubeNamespace() string { return "dbcloud-" + s.boot.ProjectID }
func kubeCluster(id string) string      { return kubernetes.ClusterName(&dbcloud.Service{ID: id}) }

// instancePods are the running instance pods of a service's Cluster.
func (s *server) instancePods(kc client.Client, id string) []corev1.Pod {
	s.t.Helper()
	var pods corev1.PodList
	if err := kc.List(context.Background(), &pods, client.InNamespace(s.kubeNamespace()),
		client.MatchingLabels{"cnpg.io/cluster": kubeCluster(id), "cnpg.io/podRole": "instance"}); err != nil {
		s.t.Fatal(err)
	}
	return pods.Items
}

// parallelOnLocal runs the test beside others on the local runtime only:
// on the single-node cluster each CNPG pod requests its size's CPU (half a
// core at least) from two cores, and the tests' pods together would wait
// for one another's to go.
func parallelOnLocal(t *testing.T) {
	if !onKubernetes() {
		t.Parallel()
	}
}

// readyPods counts the pods that are Ready and not being deleted.
func readyPods(pods []corev1.Pod) int {
	n := 0
	for _, p := range pods {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
				n++
			}
		}
	}
	return n
}

// waitSettled waits for the service's queued operations to end, then for
// READY: right after a 202 the service can still show the READY of before
// the operation started.
func (s *server) waitSettled(id string, within time.Duration) service {
	s.t.Helper()
	for _, op := range s.operations(id) {
		if op.State == "pending" {
			if op = s.waitOperation(op.ID, within); op.State != "succeeded" {
				s.t.Fatalf("operation %s %s: %s (%s)", op.ID, op.Type, op.State, op.Reason)
			}
		}
	}
	return s.waitStatus(id, "READY", within)
}

// TestRuntime_Resize resizes a running service with a row in it: READY
// again with the size's PostgreSQL settings and the row; on Kubernetes,
// every instance pod has the size's CPU and memory (requests and limits).
func TestRuntime_Resize(t *testing.T) {
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "resize", "cpu_millis": "500", "memory_gbs": "2"})
	id, pw := created.ServiceID, created.InitialPassword
	svc := s.waitStatus(id, "READY", readyWithin())
	c := s.mustConnect(svc, pw)
	if _, err := c.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('before resize')"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	began := time.Now()
	if code := s.call("POST", s.services()+"/"+id+"/resize", map[string]string{"cpu_millis": "1000", "memory_gbs": "4"}, nil); code != 202 {
		t.Fatalf("resize: %d", code)
	}
	svc = s.waitSettled(id, readyWithin())
	t.Logf("resize to READY: %.1f s", time.Since(began).Seconds())
	c = s.mustConnect(svc, pw)
	var sb, v string
	if err := c.QueryRow(ctx, "SHOW shared_buffers").Scan(&sb); err != nil || sb != "1GB" {
		t.Errorf("after resize to 1000/4: shared_buffers %q (%v), want 1GB", sb, err)
	}
	if err := c.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != "before resize" {
		t.Errorf("after resize: %q %v", v, err)
	}
	if !onKubernetes() {
		return // TestService_Lifecycle checks the local instances' cgroup limits
	}
	pods := s.instancePods(kubeClient(t), id)
	if len(pods) != 1 {
		t.Fatalf("%d instance pods, want 1", len(pods))
	}
	for _, p := range pods {
		for _, ctr := range p.Spec.Containers {
			if ctr.Name != "postgres" {
				continue
			}
			r := ctr.Resources
			if !r.Limits.Cpu().Equal(resource.MustParse("1")) || !r.Limits.Memory().Equal(resource.MustParse("4Gi")) ||
				!r.Requests.Cpu().Equal(*r.Limits.Cpu()) || !r.Requests.Memory().Equal(*r.Limits.Memory()) {
				t.Errorf("pod %s after resize to 1000/4: requests %v, limits %v; want cpu 1 and memory 4Gi in both", p.Name, r.Requests, r.Limits)
			}
		}
	}
}

// TestRuntime_LogsAndMetrics reads a service's PostgreSQL log and its
// metrics through the API: a WARNING raised over a connection is found by
// search with its severity, and the engine records the service's disk
// usage and its connections (the test's own counted).
func TestRuntime_LogsAndMetrics(t *testing.T) {
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "observed"})
	id := created.ServiceID
	svc := s.waitStatus(id, "READY", readyWithin())
	db := s.mustConnect(svc, created.InitialPassword)

	marker := fmt.Sprintf("mk%x", time.Now().UnixNano())
	warning := "seen " + marker + " here"
	if _, err := db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN RAISE WARNING '%s'; END $$`, warning)); err != nil {
		t.Fatal(err)
	}
	l := s.waitLogs(id, url.Values{"search": {strings.ToUpper(marker)}, "severities": {"warning"}}, 1)
	if len(l.Entries) != 1 || l.Entries[0].Severity != "WARNING" || l.Entries[0].Message != warning {
		t.Errorf("logs searched for the marker: %+v; want the one WARNING %q", l.Entries, warning)
	}
	if l, _ := s.logs(id, url.Values{"search": {marker}, "severities": {"ERROR"}}); len(l.Entries) != 0 {
		t.Errorf("search with severity ERROR: %v, want none", l.Logs)
	}

	// The engine measures every few seconds; the open connection is counted.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		_, disk := total(s.series(id, dbcloud.SeriesDiskUsage, ""))
		_, conns := total(s.series(id, dbcloud.SeriesConnections, ""))
		got, _ := s.get(id)
		if disk > 0 && conns >= 1 && got.Metrics != nil && got.Metrics.StorageMB > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 2 min: disk usage %v bytes, connections %v, service metrics %+v; want disk > 0, connections >= 1", disk, conns, got.Metrics)
		}
	}
}

// TestRuntime_HAFailover: a PROD service given one HA replica by setHA,
// a row written, then its primary's pod deleted. The service accepts
// writes again through the same endpoint, on the promoted replica, with
// the row; the time from the delete to the first write acknowledged is
// CNPG's detection and promotion, logged (docs/kubernetes.md quotes it).
// The local runtime's failover is TestHA's.
func TestRuntime_HAFailover(t *testing.T) {
	if !onKubernetes() {
		t.Skip("deletes a CloudNativePG pod; TestHA fails the local runtime's primary")
	}
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "failover", "environment_tag": "PROD"})
	id, pw := created.ServiceID, created.InitialPassword
	s.waitStatus(id, "READY", readyWithin())
	if code := s.call("POST", s.services()+"/"+id+"/setHA", map[string]int{"replica_count": 1, "sync_replica_count": 0}, nil); code != 202 {
		t.Fatalf("setHA: %d", code)
	}
	svc := s.waitSettled(id, readyWithin())
	kc := kubeClient(t)
	if pods := s.instancePods(kc, id); len(pods) != 2 {
		t.Fatalf("%d instance pods after setHA 1, want 2", len(pods))
	}
	c := s.mustConnect(svc, pw)
	if _, err := c.Exec(ctx, "CREATE TABLE acked (id int PRIMARY KEY); INSERT INTO acked VALUES (0)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	var cluster apiv1.Cluster
	key := client.ObjectKey{Namespace: s.kubeNamespace(), Name: kubeCluster(id)}
	if err := kc.Get(ctx, key, &cluster); err != nil {
		t.Fatal(err)
	}
	primary := cluster.Status.CurrentPrimary
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: primary}}
	if err := kc.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	// A deleted pod's PostgreSQL shuts down smartly and takes writes for
	// a moment: only a write on another pod's server counts.
	oldIP := pod.Status.PodIP
	deleted := time.Now()
	if err := kc.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	took := s.firstWrite(svc, pw, 1, oldIP, 3*time.Minute).Sub(deleted)
	t.Logf("failover: primary pod %s deleted, first write acknowledged through the endpoint %.1f s later", primary, took.Seconds())

	if err := kc.Get(ctx, key, &cluster); err != nil {
		t.Fatal(err)
	}
	if cluster.Status.CurrentPrimary == primary {
		t.Errorf("CNPG's current primary is still %s after the write", primary)
	}
	c = s.mustConnect(svc, pw)
	var n int
	var inRecovery bool
	if err := c.QueryRow(ctx, "SELECT count(*), pg_is_in_recovery() FROM acked WHERE id IN (0, 1)").Scan(&n, &inRecovery); err != nil || n != 2 || inRecovery {
		t.Errorf("on the endpoint after the failover: %d of the 2 rows, in recovery %v (%v)", n, inRecovery, err)
	}
	// READY again once the old primary is back as a replica.
	for deadline := time.Now().Add(readyWithin()); ; time.Sleep(time.Second) {
		got, _ := s.get(id)
		if got.Status == "READY" && readyPods(s.instancePods(kc, id)) == 2 {
			t.Logf("READY with 2 instances again %.1f s after the delete", time.Since(deleted).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not READY with 2 instances within %v of the failover: %s (%s)", readyWithin(), got.Status, got.StatusReason)
		}
	}
}

// firstWrite inserts row id into acked through the service's endpoint
// until a server other than notAddr acknowledges the commit, and returns when.
func (s *server) firstWrite(svc service, password string, id int, notAddr string, within time.Duration) time.Time {
	s.t.Helper()
	ctx := context.Background()
	var last error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		c, err := s.connect(cctx, svc, password)
		var addr string
		if err == nil {
			err = c.QueryRow(cctx, "INSERT INTO acked VALUES ($1) ON CONFLICT (id) DO UPDATE SET id = EXCLUDED.id RETURNING host(inet_server_addr())", id).Scan(&addr)
			c.Close(ctx)
		}
		cancel()
		if err == nil && addr != notAddr {
			return time.Now()
		}
		if err == nil {
			err = fmt.Errorf("acknowledged by %s, the old primary", addr)
		}
		last = err
	}
	s.t.Fatalf("no write acknowledged through %s:%d within %v: %v", svc.Endpoint.Host, svc.Endpoint.Port, within, last)
	return time.Time{}
}

// checkNothingLeft polls until the namespace holds nothing of the deleted
// service's: no Cluster, pod, PersistentVolumeClaim, Secret or Service
// named for its Cluster or labelled with it (CNPG's own objects go with
// the Cluster through owner references, the garbage collector's work).
func (s *server) checkNothingLeft(kc client.Client, id string, within time.Duration) {
	s.t.Helper()
	name := kubeCluster(id)
	ofService := func(o metav1.Object) bool {
		l := o.GetLabels()
		return strings.HasPrefix(o.GetName(), name) || l["cnpg.io/cluster"] == name || l[kubernetes.LabelService] == id
	}
	var left []string
	for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
		left = left[:0]
		for _, list := range []client.ObjectList{&apiv1.ClusterList{}, &corev1.PodList{}, &corev1.PersistentVolumeClaimList{},
			&corev1.SecretList{}, &corev1.ServiceList{}} {
			if err := kc.List(context.Background(), list, client.InNamespace(s.kubeNamespace())); err != nil {
				s.t.Fatal(err)
			}
			items, err := metaObjects(list)
			if err != nil {
				s.t.Fatal(err)
			}
			for _, o := range items {
				if ofService(o) {
					left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%v after the service's delete: %v", within, left)
		}
	}
}

// metaObjects are the items of a list.
func metaObjects(list client.ObjectList) ([]metav1.Object, error) {
	objs, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := make([]metav1.Object, 0, len(objs))
	for _, o := range objs {
		m, err := meta.Accessor(o)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}
