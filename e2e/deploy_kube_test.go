package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/deploy"
	"dbcloud/internal/testports"
	"dbcloud/tlsca"
)

// TestDeploy_TwoReplicas deploys dbcloud itself by deploy/'s manifests into
// the run's cluster (scripts/kube-node.sh): two replicas on a store that is
// a CNPG Cluster, the API reached from the host through a NodePort, a
// service created through it; then a second service, and the replica
// holding its lease is deleted mid-create: the other replica finishes it
// and the Deployment replaces the pod.
func TestDeploy_TwoReplicas(t *testing.T) {
	if !onKubernetes() {
		t.Skip("deploys dbcloud into the cluster of -e2e.runtime=kubernetes")
	}
	env := kubeNodeEnv(t)
	kc := kubeClient(t)
	ctx := context.Background()
	d := &deployment{t: t, kc: kc, env: env, ns: "dbcloud-system-" + dbcloud.NewID()}
	d.importImage()
	began := time.Now()
	d.apply()
	d.waitStore()
	t.Logf("store Cluster healthy %.1f s after apply", time.Since(began).Seconds())
	d.waitReplicas(2, "")
	t.Logf("both dbcloud pods Ready %.1f s after apply", time.Since(began).Seconds())
	s := d.apiClient()

	created := time.Now()
	first := s.create(map[string]any{"name": "deployed-a"})
	svc := s.waitSettled(first.ServiceID, readyWithin())
	t.Logf("create to READY through the deployed API: %.1f s", time.Since(created).Seconds())
	s.mustConnect(svc, first.InitialPassword).Close(ctx)

	// The second create is interrupted in flight: the pod whose engine holds
	// the service's lease (a row of the store) is deleted at once.
	second := s.create(map[string]any{"name": "deployed-b"})
	holder := d.freezeLeaseHolder(s, second.ServiceID)
	survivors := map[string]bool{}
	for _, p := range d.pods() {
		survivors[p.Name] = p.Name != holder
	}
	zero := int64(0)
	if err := kc.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: holder, Namespace: d.ns}},
		&client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	t.Logf("froze and deleted %s (grace period 0), holding the lease of %s", holder, second.ServiceID)
	taker := d.waitLeaseHolder(second.ServiceID, holder, 2*time.Minute)
	// Either replica may take it: the one that ran beside the frozen pod,
	// or the Deployment's new one if it polls the store first.
	which := "the replica that ran beside it"
	if !survivors[taker] {
		which = "the Deployment's new replica"
	}
	t.Logf("%s took the lease %.1f s after the delete: %s", taker, time.Since(deleted).Seconds(), which)
	svc = s.waitSettled(second.ServiceID, readyWithin())
	t.Logf("%s finished the create: READY %.1f s after the delete", taker, time.Since(deleted).Seconds())
	s.mustConnect(svc, second.InitialPassword).Close(ctx)
	d.waitReplicas(2, holder)
	t.Logf("the Deployment's replacement Ready %.1f s after the delete", time.Since(deleted).Seconds())

	for _, id := range []string{first.ServiceID, second.ServiceID} {
		if code := s.call("DELETE", s.services()+"/"+id, nil, nil); code != 202 {
			t.Fatalf("delete %s: %d", id, code)
		}
	}
	for _, id := range []string{first.ServiceID, second.ServiceID} {
		s.waitGone(id, 5*time.Minute)
	}
}

// freezeLeaseHolder SIGSTOPs the pod whose engine holds the service's
// lease, so that the delete's SIGTERM finds no process able to let the
// lease go: a crash, and the other replica must wait out the lease's TTL.
// A lease is held for one round of work, so the holder may let it go
// between the read and the freeze: then it is thawed and the next holder
// frozen instead, until a frozen pod is seen holding it.
func (d *deployment) freezeLeaseHolder(s *server, id string) string {
	for range 20 {
		holder := d.waitLeaseHolder(id, "", time.Minute)
		if got, _ := s.get(id); got.Status == "READY" {
			d.t.Fatalf("service %s was READY before its lease holder %s could be frozen", id, holder)
		}
		pid := d.freeze(holder)
		if owner, err := d.leaseOwner(context.Background(), id); err == nil && owner == holder {
			return holder
		}
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			d.t.Fatalf("thaw %s (pid %d): %v", holder, pid, err)
		}
	}
	d.t.Fatalf("no replica was seen frozen while holding the lease of %s in 20 tries", id)
	return ""
}

// freeze stops the dbcloud process of a pod with SIGSTOP, by the PID
// containerd reports for its container on this node, and returns the PID.
func (d *deployment) freeze(pod string) int {
	var p corev1.Pod
	if err := d.kc.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: pod}, &p); err != nil || len(p.Status.ContainerStatuses) != 1 {
		d.t.Fatalf("pod %s: %v", pod, err)
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	out, err := exec.Command("ctr", "--address", d.env["KUBE_RUN"]+"/containerd.sock", "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		d.t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err == nil {
				err = syscall.Kill(pid, syscall.SIGSTOP)
			}
			if err != nil {
				d.t.Fatalf("freeze %s (pid %s): %v", pod, f[1], err)
			}
			return pid
		}
	}
	d.t.Fatalf("no containerd task %s for pod %s", id, pod)
	return 0
}

// kubeNodeEnv reads the names scripts/kube-node.env gives the cluster's
// images, socket and node address: written once, there.
func kubeNodeEnv(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("bash", "-c", `. ../scripts/kube-node.env && printf '%s\n' `+
		`"KUBE_IMAGE_DBCLOUD=$KUBE_IMAGE_DBCLOUD" "KUBE_IMAGE_POSTGRES=$KUBE_IMAGE_POSTGRES" "KUBE_RUN=$KUBE_RUN" "KUBE_NODE_IP=$KUBE_NODE_IP"`).Output()
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
	}
	return env
}

// deployment is one installation of deploy/ in its own namespace.
type deployment struct {
	t       *testing.T
	kc      client.Client
	env     map[string]string
	ns      string
	apiPort int
	ca      *tlsca.CA
	// projectID is the project the first replica bootstrapped.
	projectID string
}

// importImage builds dbcloud's image from this checkout and imports it into
// the cluster's containerd, as kube-node.sh up does the others: it changes
// with every commit, so up does not, and it is removed again at the end.
func (d *deployment) importImage() {
	t := d.t
	out, err := exec.Command("../scripts/kube-images.sh", "dbcloud").Output()
	if err != nil {
		t.Fatalf("scripts/kube-images.sh dbcloud: %v", err)
	}
	ctr := func(args ...string) *exec.Cmd {
		return exec.Command("ctr", append([]string{"--address", d.env["KUBE_RUN"] + "/containerd.sock", "-n", "k8s.io"}, args...)...)
	}
	if b, err := ctr("images", "import", strings.TrimSpace(string(out))).CombinedOutput(); err != nil {
		t.Fatalf("import %s: %v: %s", d.env["KUBE_IMAGE_DBCLOUD"], err, b)
	}
	t.Cleanup(func() {
		if b, err := ctr("images", "rm", d.env["KUBE_IMAGE_DBCLOUD"]).CombinedOutput(); err != nil {
			t.Errorf("remove image: %v: %s", err, b)
		}
	})
}

// apply creates deploy/'s objects adapted to this cluster: its namespace
// and cluster-wide names made unique, 2 replicas of this checkout's image
// (never pulled), a one-instance store on a small local volume, the API's
// certificate, the runtime's flags as the suite's servers get them, and
// the API on a node port of the node's address.
func (d *deployment) apply() {
	t := d.t
	ctx := context.Background()
	objs, err := deploy.Manifests("../deploy")
	if err != nil {
		t.Fatal(err)
	}
	lo := testports.MustBlock(t)
	d.apiPort = lo
	d.ca, err = tlsca.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := d.ca.IssueServerCert("dbcloud", []string{d.env["KUBE_NODE_IP"], "dbcloud." + d.ns + ".svc"}, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	args := append(strings.Fields(*e2eKubeArgs), "--port-min", strconv.Itoa(lo+1), "--port-max", strconv.Itoa(lo+testports.BlockSize-1))
	t.Cleanup(d.remove)
	for _, u := range objs {
		d.adapt(u, args)
		if err := d.kc.Create(ctx, u); err != nil {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
		}
		if u.GetKind() == "Namespace" {
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dbcloud-tls", Namespace: d.ns}, Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{"tls.crt": cert, "tls.key": key}}
			if err := d.kc.Create(ctx, secret); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// adapt is the overlay of this cluster over one object of deploy/.
func (d *deployment) adapt(u *unstructured.Unstructured, args []string) {
	set := func(v any, path ...string) {
		if err := unstructured.SetNestedField(u.Object, v, path...); err != nil {
			d.t.Fatalf("%s %v: %v", u.GetKind(), path, err)
		}
	}
	if u.GetNamespace() != "" {
		u.SetNamespace(d.ns)
	}
	switch u.GetKind() {
	case "Namespace":
		u.SetName(d.ns)
	case "ClusterRole":
		u.SetName(u.GetName() + "-" + d.ns)
	case "ClusterRoleBinding":
		u.SetName(u.GetName() + "-" + d.ns)
		set(u.GetName(), "roleRef", "name")
		subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
		for _, s := range subjects {
			s.(map[string]any)["namespace"] = d.ns
		}
		set(subjects, "subjects")
	case "Cluster":
		set(int64(1), "spec", "instances")
		set("1Gi", "spec", "storage", "size")
		set(d.env["KUBE_IMAGE_POSTGRES"], "spec", "imageName")
		// One instance has no standby to wait for.
		unstructured.RemoveNestedField(u.Object, "spec", "postgresql", "synchronous")
	case "Deployment":
		set(int64(2), "spec", "replicas")
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		c := containers[0].(map[string]any)
		c["image"] = d.env["KUBE_IMAGE_DBCLOUD"]
		c["imagePullPolicy"] = "Never"
		for _, a := range args {
			c["args"] = append(c["args"].([]any), a)
		}
		set(containers, "spec", "template", "spec", "containers")
	case "Service":
		set("NodePort", "spec", "type")
		ports, _, _ := unstructured.NestedSlice(u.Object, "spec", "ports")
		ports[0].(map[string]any)["nodePort"] = int64(d.apiPort)
		set(ports, "spec", "ports")
	}
}

// remove deletes what apply made and the project namespaces the deployed
// runtime made, and waits until they are gone. The replicas go first: one
// still reconciling would make a project's namespace again after its
// delete (a run that failed mid-create leaves work in flight).
func (d *deployment) remove() {
	ctx := context.Background()
	if err := d.kc.DeleteAllOf(ctx, &appsv1.Deployment{}, client.InNamespace(d.ns)); err != nil && !apierrors.IsNotFound(err) {
		d.t.Error(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); len(d.pods()) > 0; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			d.t.Errorf("dbcloud's pods still there 2 min after their Deployment's delete")
			break
		}
	}
	var nss corev1.NamespaceList
	if err := d.kc.List(ctx, &nss, client.MatchingLabels{"app.kubernetes.io/managed-by": "dbcloud"}); err != nil {
		d.t.Error(err)
	}
	names := []string{d.ns}
	for _, n := range nss.Items {
		// Only this installation's projects: made after its namespace.
		if d.projectID != "" && n.Labels["dbcloud.io/project"] == d.projectID {
			names = append(names, n.Name)
		}
	}
	for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("rbac.authorization.k8s.io/v1")
		u.SetKind(kind)
		u.SetName("dbcloud-runtime-" + d.ns)
		if err := d.kc.Delete(ctx, u); err != nil && !apierrors.IsNotFound(err) {
			d.t.Error(err)
		}
	}
	for _, n := range names {
		if err := d.kc.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil && !apierrors.IsNotFound(err) {
			d.t.Error(err)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	for _, n := range names {
		for {
			err := d.kc.Get(ctx, client.ObjectKey{Name: n}, &corev1.Namespace{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				d.t.Errorf("namespace %s still there after 5 min: %v", n, err)
				break
			}
			time.Sleep(time.Second)
		}
	}
}

// waitStore waits for the store Cluster to be healthy.
func (d *deployment) waitStore() {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("postgresql.cnpg.io/v1")
	u.SetKind("Cluster")
	deadline := time.Now().Add(readyWithin())
	for {
		err := d.kc.Get(context.Background(), client.ObjectKey{Namespace: d.ns, Name: "dbcloud-store"}, u)
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		if err == nil && phase == "Cluster in healthy state" {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("store Cluster not healthy within %v: %v, phase %q", readyWithin(), err, phase)
		}
		time.Sleep(time.Second)
	}
}

// waitReplicas waits for n Ready dbcloud pods, none of them named gone.
func (d *deployment) waitReplicas(n int, gone string) {
	deadline := time.Now().Add(readyWithin())
	for {
		pods := d.pods()
		ready, stale := readyPods(pods), false
		for _, p := range pods {
			stale = stale || p.Name == gone
		}
		if ready == n && !stale {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("want %d Ready dbcloud pods (not %q) within %v, have %d of %d", n, gone, readyWithin(), ready, len(pods))
		}
		time.Sleep(time.Second)
	}
}

func (d *deployment) pods() []corev1.Pod {
	var pods corev1.PodList
	if err := d.kc.List(context.Background(), &pods, client.InNamespace(d.ns), client.MatchingLabels{"app.kubernetes.io/name": "dbcloud"}); err != nil {
		d.t.Fatal(err)
	}
	return pods.Items
}

// storeURI is the store's URI (the Secret CNPG wrote, which the replicas
// read) with the primary pod's address on the node's bridge for its host,
// so the host reaches it as the replicas do through the -rw Service.
func (d *deployment) storeURI() string {
	ctx := context.Background()
	var secret corev1.Secret
	if err := d.kc.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: "dbcloud-store-app"}, &secret); err != nil {
		d.t.Fatal(err)
	}
	var pods corev1.PodList
	if err := d.kc.List(ctx, &pods, client.InNamespace(d.ns), client.MatchingLabels{"cnpg.io/cluster": "dbcloud-store", "cnpg.io/instanceRole": "primary"}); err != nil || len(pods.Items) != 1 {
		d.t.Fatalf("the store's primary pod: %v (%d pods)", err, len(pods.Items))
	}
	u, err := url.Parse(string(secret.Data["uri"]))
	if err != nil {
		d.t.Fatal("the store Secret's uri does not parse")
	}
	u.Host = net.JoinHostPort(pods.Items[0].Status.PodIP, u.Port())
	return u.String()
}

// apiClient is a client of the deployed API from the host. The first
// replica wrote the bootstrap credentials into its emptyDir, which nothing
// outside the pod reads; the operator issues a key from the store instead,
// as with any installation on a PostgreSQL store (dbcloud admin).
func (d *deployment) apiClient() *server {
	t := d.t
	uri := d.storeURI()
	var projects []struct {
		ID string `json:"id"`
	}
	d.admin(&projects, "project", "list", "--json", "--store", uri)
	if len(projects) != 1 {
		t.Fatalf("want the one project the first replica bootstrapped, have %v", projects)
	}
	d.projectID = projects[0].ID
	s := &server{t: t, baseURL: "https://" + net.JoinHostPort(d.env["KUBE_NODE_IP"], strconv.Itoa(d.apiPort)) + "/public/api/v1"}
	d.admin(&s.boot, "key", "create", "--json", "--project", d.projectID, "--name", "e2e-deploy", "--store", uri)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(d.ca.CertPEM)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	deadline := time.Now().Add(time.Minute)
	for {
		res, err := s.client.Get(strings.TrimSuffix(s.baseURL, "/public/api/v1") + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return s
			}
			err = fmt.Errorf("status %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the deployed API at %s: %v", s.baseURL, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// admin runs this checkout's `dbcloud admin ARGS` and decodes its JSON.
func (d *deployment) admin(out any, args ...string) {
	b, err := exec.Command(binary, append([]string{"admin"}, args...)...).Output()
	if err != nil {
		d.t.Fatalf("dbcloud admin %s %s: %v", args[0], args[1], err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		d.t.Fatalf("dbcloud admin %s %s: %v: %s", args[0], args[1], err, b)
	}
}

// waitLeaseHolder waits until the resource's lease (a row of the store's
// leases table, its owner a replica's --node-id: the pod's name) is held
// by a pod other than not, and returns that pod.
func (d *deployment) waitLeaseHolder(id, not string, within time.Duration) string {
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for {
		owner, err := d.leaseOwner(ctx, id)
		if err == nil && owner != "" && owner != not {
			return owner
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("lease of %s: want a holder other than %q within %v, have %q (%v)", id, not, within, owner, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (d *deployment) leaseOwner(ctx context.Context, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, d.storeURI())
	if err != nil {
		return "", err
	}
	defer c.Close(ctx)
	var owner string
	err = c.QueryRow(ctx, "SELECT owner FROM leases WHERE resource_id = $1", id).Scan(&owner)
	if err == pgx.ErrNoRows {
		return "", nil
	}
	return owner, err
}
