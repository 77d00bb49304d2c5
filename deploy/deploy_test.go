// Package deploy_test validates the Kustomize manifests of deploy/ against
// a real kube-apiserver with CloudNativePG's CRDs, and checks that the RBAC
// they grant is enough for the kubernetes runtime, and no more than it needs.
package deploy_test

import (
	"context"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/deploy"
	"dbcloud/internal/kubetest"
	"dbcloud/runtime/kubernetes"
)

// manifests are deploy/'s objects.
func manifests(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := deploy.Manifests(".")
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func start(t *testing.T) (*kubetest.Env, client.Client) {
	t.Helper()
	scheme, err := kubernetes.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return kubetest.StartT(t, scheme)
}

// TestManifests: every object of deploy/ passes the apiserver's validation
// (server-side dry run; CNPG's Cluster against its CRD), and the runtime
// working as the ServiceAccount the manifests make can do all it does, but
// not what it never needs.
func TestManifests(t *testing.T) {
	env, c := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	objs := manifests(t)
	kinds := map[string]bool{}
	for _, u := range objs {
		kinds[u.GetKind()] = true
		// The namespace is made for real: the dry runs of what goes in it
		// need it to exist.
		if u.GetKind() == "Namespace" {
			if err := c.Create(ctx, u.DeepCopy()); err != nil {
				t.Fatalf("create namespace: %v", err)
			}
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Cluster", "Deployment", "Service"} {
		if !kinds[k] {
			t.Errorf("the manifests have no %s", k)
		}
	}
	for _, u := range objs {
		if u.GetKind() == "Namespace" {
			continue
		}
		if err := c.Create(ctx, u.DeepCopy(), client.DryRunAll); err != nil {
			t.Errorf("dry run of %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if t.Failed() {
		return
	}

	// Now for real, the RBAC objects, then act as the ServiceAccount.
	for _, u := range objs {
		switch u.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
			if err := c.Create(ctx, u.DeepCopy()); err != nil {
				t.Fatal(err)
			}
		}
	}
	sa := rest.CopyConfig(env.Config)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:dbcloud-system:dbcloud"}
	rt, err := kubernetes.NewForConfig(sa, kubernetes.Config{ObjectStore: "dbcloud-archive", PollInterval: 20 * time.Millisecond,
		Expose: kubernetes.ExposeLoadBalancer})
	if err != nil {
		t.Fatal(err)
	}
	svc := &dbcloud.Service{ID: dbcloud.NewID(), ProjectID: dbcloud.NewID(), Generation: 1,
		Spec:             dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvProd, Replicas: 1, Pooler: true, Running: true},
		PasswordVerifier: dbcloud.NewSCRAMVerifier("pw")}
	// Every call of the runtime, each needing its own verbs (RBAC
	// propagates within a moment after the binding is made).
	deadline := time.Now().Add(30 * time.Second)
	for err = rt.Apply(ctx, svc); apierrors.IsForbidden(err) && time.Now().Before(deadline); err = rt.Apply(ctx, svc) {
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Apply as the ServiceAccount: %v", err)
	}
	set := &dbcloud.ReadReplicaSet{ID: dbcloud.NewID(), ProjectID: svc.ProjectID, ServiceID: svc.ID,
		Spec: dbcloud.ReadReplicaSetSpec{Size: dbcloud.DefaultSize, Nodes: 1, Environment: dbcloud.EnvProd, Pooler: true}}
	if err := rt.ApplyReplicaSet(ctx, svc, set); err != nil {
		t.Fatalf("ApplyReplicaSet: %v", err)
	}
	if _, err := rt.CheckService(ctx, svc, true); err != nil {
		t.Fatalf("CheckService: %v", err)
	}
	if _, err := rt.Logs(ctx, svc, dbcloud.LogQuery{Limit: 10}); err != nil {
		t.Fatalf("Logs: %v", err)
	}
	if err := rt.DeleteService(ctx, svc); err != nil {
		t.Fatalf("DeleteService: %v", err)
	}
	// The instances' metrics are read through the pod proxy, which no call
	// above reaches without running pods: ask the authorizer.
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: rt.Namespace(svc.ProjectID), Verb: "get", Resource: "pods", Subresource: "proxy"}}}
	if err := saClient(t, sa).Create(ctx, review); err != nil || !review.Status.Allowed {
		t.Errorf("get pods/proxy as the ServiceAccount: %v, allowed %v", err, review.Status.Allowed)
	}

	// And no more: the ServiceAccount reads no nodes, deletes no namespace,
	// and cannot grant itself anything.
	sc := saClient(t, sa)
	if err := sc.List(ctx, &corev1.NodeList{}); !apierrors.IsForbidden(err) {
		t.Errorf("list nodes as the ServiceAccount: %v, want forbidden", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rt.Namespace(svc.ProjectID)}}
	if err := sc.Delete(ctx, ns); !apierrors.IsForbidden(err) {
		t.Errorf("delete a namespace as the ServiceAccount: %v, want forbidden", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: ns.Name}}
	if err := sc.Create(ctx, cm); !apierrors.IsForbidden(err) {
		t.Errorf("create a ConfigMap as the ServiceAccount: %v, want forbidden", err)
	}
}

func saClient(t *testing.T, sa *rest.Config) client.Client {
	t.Helper()
	scheme, _ := kubernetes.Scheme()
	sc, err := client.New(sa, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}
