package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// TestRuntime_HAFailover: a PROD service given two HA replicas, one of
// them synchronous, by setHA (TestHA's setting: with sync_replica_count 1
// no acknowledged commit may be lost), its primary broken twice while
// writers commit through the endpoint: first killed (every process of its
// PostgreSQL container at once, as a crash of its node would, with no
// shutdown), then its pod deleted (CNPG's graceful path). Every commit
// acknowledged, by the old primary during its shutdown or by the new one,
// is on the primary that serves afterwards; the endpoint reaches it; CNPG
// brings the service back to three instances. The time from the break to
// the first commit after it (for the delete: by another server) is CNPG's
// detection and promotion, logged with the longest time no commit was
// acknowledged (docs/kubernetes.md quotes both). The local runtime's
// failover is TestHA's.
func TestRuntime_HAFailover(t *testing.T) {
	if !onKubernetes() {
		t.Skip("breaks a CloudNativePG pod; TestHA fails the local runtime's primary")
	}
	parallelOnLocal(t)
	s := newServer(t)
	ctx := context.Background()
	created := s.create(map[string]any{"name": "failover", "environment_tag": "PROD"})
	id, pw := created.ServiceID, created.InitialPassword
	s.waitStatus(id, "READY", readyWithin())
	if code := s.call("POST", s.services()+"/"+id+"/setHA", map[string]int{"replica_count": 2, "sync_replica_count": 1}, nil); code != 202 {
		t.Fatalf("setHA: %d", code)
	}
	svc := s.waitSettled(id, readyWithin())
	kc := kubeClient(t)
	if pods := s.instancePods(kc, id); len(pods) != 3 {
		t.Fatalf("%d instance pods after setHA 2, want 3", len(pods))
	}
	c := s.mustConnect(svc, pw)
	var syncNames string
	if err := c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&syncNames); err != nil || !strings.HasPrefix(syncNames, "ANY 1 (") {
		t.Fatalf("synchronous_standby_names %q (%v), want ANY 1 of the standbys", syncNames, err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE acked (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)

	from := 0
	for _, round := range []struct {
		how string
		// mustMove: only a commit by another server ends the failover.
		mustMove bool
		breakIt  func(primary string)
	}{
		{"killed", false, func(primary string) { killContainer(t, s.pod(kc, primary), "postgres") }},
		{"deleted", true, func(primary string) {
			if err := kc.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.kubeNamespace(), Name: primary}}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		s.failoverRound(t, kc, svc, pw, from, round.how, round.mustMove, round.breakIt)
		from += 10_000_000
	}
}

// failoverRound runs two writers through svc's endpoint, one keeping its
// session as an application's pool does, the other opening a connection
// per commit as a new client does (ids from from on), breaks the primary
// with breakIt, and checks what TestRuntime_HAFailover says.
func (s *server) failoverRound(t *testing.T, kc client.Client, svc service, pw string, from int, how string, mustMove bool, breakIt func(primary string)) {
	ctx := context.Background()
	id := svc.ServiceID
	primary, oldIP := s.kubePrimary(kc, id)
	session, fresh := s.startWriter(svc, pw, from, false), s.startWriter(svc, pw, from+1_000_000, true)
	for _, w := range []*ackWriter{session, fresh} {
		w.waitAcks(t, 20, time.Time{}, anyServer, time.Minute)
	}
	broken := time.Now()
	breakIt(primary)
	// A deleted pod's PostgreSQL may go on acknowledging commits while
	// it shuts down: those count as written, and only a commit by
	// another server ends the failover. A killed one acknowledges
	// nothing more, and the next commit may be by its own restart.
	after := anyServer
	if mustMove {
		after = func(a ack) bool { return a.server != oldIP }
	}
	var acks []ack
	for _, w := range []*ackWriter{session, fresh} {
		first := w.waitAcks(t, 1, broken, after, 5*time.Minute)
		// After a kill the first acknowledgement may come before CNPG's
		// failover (a commit in flight, or the killed primary's own
		// restart), and on a 2-core machine CNPG took 55 to 60 s to
		// detect and promote: the next ten get the first one's bound.
		// How long writes stopped is measured and logged below.
		w.waitAcks(t, 10, first, anyServer, 5*time.Minute)
		got := w.halt()
		gap := longestGap(got, time.Time{}, time.Time{})
		byOld := 0
		for _, a := range got {
			if a.at.After(broken) && a.server == oldIP {
				byOld++
			}
		}
		kind := "session writer"
		if w.fresh {
			kind = "writer connecting per commit"
		}
		t.Logf("failover, %s: primary pod %s %s; first commit after it %.1f s later; longest time without a commit %.1f s; %d commits by the old primary's address after it",
			kind, primary, how, first.Sub(broken).Seconds(), gap.Seconds(), byOld)
		acks = append(acks, got...)
	}

	// READY with three ready instances before anything is checked
	// through the endpoint: after a kill, CNPG may still move the primary,
	// or the endpoint lose its ready address for a while, after the
	// writers' first commits (seen in CI: refused right after them).
	for deadline := time.Now().Add(readyWithin()); ; time.Sleep(time.Second) {
		got, _ := s.get(id)
		if got.Status == "READY" && readyPods(s.instancePods(kc, id)) == 3 {
			t.Logf("READY with 3 instances again %.1f s after the primary was %s", time.Since(broken).Seconds(), how)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not READY with 3 instances within %v of the failover: %s (%s)", readyWithin(), got.Status, got.StatusReason)
		}
	}
	now, _ := s.kubePrimary(kc, id)
	switch {
	case now == primary && mustMove:
		t.Errorf("CNPG's current primary is still %s after its pod was %s", primary, how)
	case now == primary:
		t.Logf("primary pod %s %s: CNPG kept it as the primary (restarted in place)", primary, how)
	default:
		t.Logf("primary pod %s %s: CNPG promoted %s", primary, how, now)
	}
	c := s.waitPrimaryLogin(svc, pw, readyWithin())
	defer c.Close(ctx)
	if lost := lostAcks(t, c, acks); len(lost) > 0 {
		t.Fatalf("%s: %d of %d acknowledged commits lost in the failover: %v", how, len(lost), len(acks), lost)
	}
	t.Logf("%s: %d acknowledged commits, all on the primary", how, len(acks))
}

// waitPrimaryLogin polls until a login through svc's endpoint reaches a
// server that is not in recovery, and returns that session.
func (s *server) waitPrimaryLogin(svc service, password string, within time.Duration) *pgx.Conn {
	s.t.Helper()
	ctx := context.Background()
	var err error
	for deadline := time.Now().Add(within); ; time.Sleep(500 * time.Millisecond) {
		var c *pgx.Conn
		if c, err = s.connect(ctx, svc, password); err == nil {
			var inRecovery bool
			if err = c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err == nil && !inRecovery {
				return c
			}
			if err == nil {
				err = errors.New("the server is in recovery")
			}
			c.Close(ctx)
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no login on the primary through %s's endpoint within %v: %v", svc.ServiceID, within, err)
		}
	}
}

// pod is the pod named name in the run's project namespace.
func (s *server) pod(kc client.Client, name string) corev1.Pod {
	s.t.Helper()
	var pod corev1.Pod
	if err := kc.Get(context.Background(), client.ObjectKey{Namespace: s.kubeNamespace(), Name: name}, &pod); err != nil {
		s.t.Fatal(err)
	}
	return pod
}

// killContainer SIGKILLs the first process of a pod's container, found
// from this host (the cluster's only node): its PID namespace ends with
// it, so the kernel kills every process of the container at once, which
// is what a crash of the node does to it, with no shutdown of any kind.
// The container's processes are in its pids cgroup, at
// kubepods[/QoS class]/pod<UID>/<container ID> (cgroupfs driver).
func killContainer(t *testing.T, pod corev1.Pod, container string) {
	t.Helper()
	var cid string
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container {
			_, cid, _ = strings.Cut(st.ContainerID, "://")
		}
	}
	if cid == "" {
		t.Fatalf("pod %s has no running container %s", pod.Name, container)
	}
	var procs []string
	for _, pattern := range []string{"/sys/fs/cgroup/pids/kubepods/pod%s/%s/cgroup.procs", "/sys/fs/cgroup/pids/kubepods/*/pod%s/%s/cgroup.procs"} {
		found, _ := filepath.Glob(fmt.Sprintf(pattern, pod.UID, cid))
		procs = append(procs, found...)
	}
	if len(procs) != 1 {
		t.Fatalf("pids cgroup of container %s of pod %s: %q, want one", container, pod.Name, procs)
	}
	b, err := os.ReadFile(procs[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		// NSpid lists the process's PID in each namespace, the
		// container's last: 1 is its first process.
		for _, line := range strings.Split(string(status), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(ns), "\t1") {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatal(err)
				}
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatalf("kill the first process %d of container %s of pod %s: %v", pid, container, pod.Name, err)
				}
				return
			}
		}
	}
	t.Fatalf("no first process among %q of container %s of pod %s", strings.Fields(string(b)), container, pod.Name)
}

// kubePrimary is CNPG's current primary of a service's Cluster and its
// pod's address (what inet_server_addr() says on it).
func (s *server) kubePrimary(kc client.Client, id string) (string, string) {
	s.t.Helper()
	ctx := context.Background()
	var cluster apiv1.Cluster
	if err := kc.Get(ctx, client.ObjectKey{Namespace: s.kubeNamespace(), Name: kubeCluster(id)}, &cluster); err != nil {
		s.t.Fatal(err)
	}
	var pod corev1.Pod
	if err := kc.Get(ctx, client.ObjectKey{Namespace: s.kubeNamespace(), Name: cluster.Status.CurrentPrimary}, &pod); err != nil {
		s.t.Fatal(err)
	}
	return cluster.Status.CurrentPrimary, pod.Status.PodIP
}

// checkNothingLeft polls until the namespace holds nothing of the deleted
// service's: no Cluster, pod, PersistentVolumeClaim, Secret or Service
// named for its Cluster or labelled with it (CNPG's own objects go with
// the Cluster through owner references, the garbage collector's work).
func (s *server) checkNothingLeft(kc client.Client, id string, within time.Duration) {
	s.t.Helper()
	name := kubeCluster(id)
	s.checkGone(kc, within, func(o metav1.Object) bool {
		l := o.GetLabels()
		return strings.HasPrefix(o.GetName(), name) || l["cnpg.io/cluster"] == name || l[kubernetes.LabelService] == id
	})
}

// checkArchiveCopiesGone polls until the namespace holds nothing dbcloud
// copied into it for the project's archive (the ObjectStore and the
// credentials it names): they go with the project's last service, so a
// project without services keeps no key to the object store.
func (s *server) checkArchiveCopiesGone(kc client.Client, within time.Duration) {
	s.t.Helper()
	s.checkGone(kc, within, func(o metav1.Object) bool {
		return o.GetLabels()[kubernetes.LabelManagedBy] == "dbcloud"
	})
}

// checkGone polls until the namespace holds no Cluster, pod,
// PersistentVolumeClaim, Secret, Service or barman-cloud ObjectStore that
// ofDeleted says belonged to what was deleted.
func (s *server) checkGone(kc client.Client, within time.Duration, ofDeleted func(metav1.Object) bool) {
	s.t.Helper()
	var left []string
	for deadline := time.Now().Add(within); ; time.Sleep(time.Second) {
		left = left[:0]
		stores := &unstructured.UnstructuredList{}
		stores.SetGroupVersionKind(schema.GroupVersionKind{Group: "barmancloud.cnpg.io", Version: "v1", Kind: "ObjectStoreList"})
		for _, list := range []client.ObjectList{&apiv1.ClusterList{}, &corev1.PodList{}, &corev1.PersistentVolumeClaimList{},
			&corev1.SecretList{}, &corev1.ServiceList{}, stores} {
			if err := kc.List(context.Background(), list, client.InNamespace(s.kubeNamespace())); err != nil {
				s.t.Fatal(err)
			}
			items, err := metaObjects(list)
			if err != nil {
				s.t.Fatal(err)
			}
			for _, o := range items {
				if ofDeleted(o) {
					left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
				}
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%v after the delete: %v", within, left)
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
