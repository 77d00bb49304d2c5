package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud/internal/kubetest"
	"dbcloud/runtime/kubernetes"
)

// startKube starts a real kube-apiserver and etcd with CNPG's CRDs, or
// skips when their binaries were never built (never in CI, which sets
// kubetest.RequireEnv after building them).
func startKube(t *testing.T) (*kubetest.Env, client.Client) {
	t.Helper()
	scheme, err := kubernetes.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return kubetest.StartT(t, scheme)
}

// waitObject polls the apiserver until obj exists (want true) or is gone.
func waitObject(t *testing.T, ctx context.Context, c client.Client, obj client.Object, want bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if (err == nil) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%T %s: want present=%v within 60 s", obj, obj.GetName(), want)
		}
	}
}

// TestRuntime_KubernetesControlPlane runs the real binary with `serve
// --runtime kubernetes` against a real kube-apiserver with CNPG's CRDs, as
// far as that goes without pods: the test plays CNPG's operator and the
// cloud provider's load balancer controller by writing the statuses they
// write. Create makes the Cluster and its LoadBalancer Service; the
// service is READY at the load balancer's address once CNPG reports the
// cluster healthy and the provider assigns the address; stop hibernates
// it; delete removes both objects.
func TestRuntime_KubernetesControlPlane(t *testing.T) {
	env, kc := startKube(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	const internalLB = "service.beta.kubernetes.io/aws-load-balancer-internal"
	s := newServer(t, "--runtime", "kubernetes", "--kubeconfig", kubeconfig,
		"--kube-expose", "loadbalancer", "--kube-expose-annotations", internalLB+"=true")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	created := s.create(map[string]any{"name": "on-kube"})
	id, port := created.ServiceID, created.Endpoint.Port
	ns, name := "dbcloud-"+s.boot.ProjectID, "svc-"+id
	cluster := &apiv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	waitObject(t, ctx, kc, cluster, true)
	if cluster.Spec.Instances != 1 || cluster.Spec.Bootstrap == nil || cluster.Spec.Bootstrap.InitDB == nil ||
		cluster.Spec.Bootstrap.InitDB.Database != "tsdb" || cluster.Spec.Bootstrap.InitDB.Owner != "tsdbadmin" {
		t.Fatalf("Cluster spec: %+v", cluster.Spec)
	}
	lb := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: kubernetes.ExternalName(name)}}
	waitObject(t, ctx, kc, lb, true)
	if lb.Spec.Type != corev1.ServiceTypeLoadBalancer || lb.Spec.Ports[0].Port != int32(port) || lb.Annotations[internalLB] != "true" {
		t.Fatalf("LoadBalancer Service: type %s ports %+v annotations %v (claimed port %d)", lb.Spec.Type, lb.Spec.Ports, lb.Annotations, port)
	}

	// CNPG: the cluster is healthy. The provider: the load balancer's address.
	if err := kubetest.WriteStatus(ctx, kc, cluster, func(c *apiv1.Cluster) { kubetest.Healthy(c, name+"-1", 1) }); err != nil {
		t.Fatal(err)
	}
	// A snapshot only (the engine may not have looked yet):
	// runtime/kubernetes' TestExposeLoadBalancer proves the rule itself.
	if svc, _ := s.get(id); svc.Status == "READY" {
		t.Fatalf("READY before the load balancer has an address: %+v", svc)
	}
	if err := kubetest.WriteStatus(ctx, kc, lb, func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.9"}}
	}); err != nil {
		t.Fatal(err)
	}
	ready := s.waitStatus(id, "READY", 60*time.Second)
	if ready.Endpoint.Host != "203.0.113.9" || ready.Endpoint.Port != port {
		t.Fatalf("endpoint %+v, want the load balancer's 203.0.113.9:%d", ready.Endpoint, port)
	}

	// Stop: CNPG's hibernation annotation, then its condition.
	if code := s.call("POST", s.services()+"/"+id+"/stop", nil, nil); code != 202 {
		t.Fatalf("stop: %d", code)
	}
	for deadline := time.Now().Add(60 * time.Second); cluster.Annotations[kubernetes.HibernationAnnotation] != "on"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no hibernation annotation after stop")
		}
		waitObject(t, ctx, kc, cluster, true)
	}
	if err := kubetest.WriteStatus(ctx, kc, cluster, func(c *apiv1.Cluster) {
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: "cnpg.io/hibernation", Status: metav1.ConditionTrue,
			Reason: "Hibernated", Message: "Cluster has been hibernated"})
	}); err != nil {
		t.Fatal(err)
	}
	s.waitStatus(id, "PAUSED", 60*time.Second)

	if code := s.call("DELETE", s.services()+"/"+id, nil, nil); code != 202 {
		t.Fatalf("delete: %d", code)
	}
	s.waitGone(id, 60*time.Second)
	waitObject(t, ctx, kc, cluster, false)
	waitObject(t, ctx, kc, lb, false)
}
