package kubernetes_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

func objectStore(ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("barmancloud.cnpg.io/v1")
	u.SetKind("ObjectStore")
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// TestObjectStoreTemplate: with --kube-object-store NAMESPACE/NAME each
// project's namespace gets the template's ObjectStore, archiving under its
// own path, with the credentials it names, so the plugin's sidecar in the
// project's pods can archive; a rotated credential reaches the project on
// its next operation.
func TestObjectStoreTemplate(t *testing.T) {
	ctx := testContext(t)
	const from, store, creds = "dbcloud-backups-test", "archive", "archive-creds"
	rt := newRuntime(t, kubernetes.Config{ObjectStore: store, ObjectStoreFrom: from})
	if err := shared.client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: from}}); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: creds, Namespace: from},
		Data:       map[string][]byte{"ACCESS_KEY_ID": []byte("dbcloud"), "ACCESS_SECRET_KEY": []byte("first")},
	}
	if err := shared.client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	tmpl := objectStore(from, store)
	ref := func(key string) map[string]any { return map[string]any{"name": creds, "key": key} }
	tmpl.Object["spec"] = map[string]any{
		"configuration": map[string]any{
			"destinationPath": "s3://backups/",
			"endpointURL":     "http://object-store.dbcloud-backups-test.svc:9000",
			"s3Credentials":   map[string]any{"accessKeyId": ref("ACCESS_KEY_ID"), "secretAccessKey": ref("ACCESS_SECRET_KEY")},
			"wal":             map[string]any{"compression": "gzip"},
		},
	}
	if err := shared.client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}

	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ns := rt.Namespace(svc.ProjectID)
	got := objectStore(ns, store)
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: store}, got); err != nil {
		t.Fatalf("no ObjectStore in the project's namespace: %v", err)
	}
	if dest, _, _ := unstructured.NestedString(got.Object, "spec", "configuration", "destinationPath"); dest != "s3://backups/"+ns {
		t.Fatalf("destinationPath %q, want the project's own path s3://backups/%s", dest, ns)
	}
	if url, _, _ := unstructured.NestedString(got.Object, "spec", "configuration", "endpointURL"); url != "http://object-store.dbcloud-backups-test.svc:9000" {
		t.Fatalf("endpointURL %q, want the template's", url)
	}
	if c, _, _ := unstructured.NestedString(got.Object, "spec", "configuration", "wal", "compression"); c != "gzip" {
		t.Fatalf("wal compression %q, want the template's", c)
	}
	if p := read(t, ctx, rt, svc).cluster.Spec.Plugins; len(p) != 1 || p[0].Parameters["barmanObjectName"] != store {
		t.Fatalf("plugins %+v, want the barman-cloud plugin on %s", p, store)
	}
	copied := func() string {
		t.Helper()
		s := &corev1.Secret{}
		if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: creds}, s); err != nil {
			t.Fatalf("credentials not in the project's namespace: %v", err)
		}
		return string(s.Data["ACCESS_SECRET_KEY"])
	}
	if s := copied(); s != "first" {
		t.Fatalf("copied secret key %q, want the template's", s)
	}

	// The copies go with the project's last Cluster: each of its Clusters
	// owns them, and the garbage collector keeps them while one is left.
	other := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	other.ProjectID = svc.ProjectID
	if err := rt.Apply(ctx, other); err != nil {
		t.Fatal(err)
	}
	copiedSecret := &corev1.Secret{}
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: creds}, copiedSecret); err != nil {
		t.Fatal(err)
	}
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: store}, got); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []*dbcloud.Service{svc, other} {
		c := read(t, ctx, rt, owner).cluster
		if !ownedBy(got, c) || !ownedBy(copiedSecret, c) {
			t.Fatalf("the ObjectStore %v and the Secret %v are not both owned by Cluster %s",
				got.GetOwnerReferences(), copiedSecret.OwnerReferences, c.Name)
		}
	}

	secret.Data["ACCESS_SECRET_KEY"] = []byte("rotated")
	if err := shared.client.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if s := copied(); s != "rotated" {
		t.Fatalf("after rotation the project has %q, want the new credential", s)
	}
}
