package kubernetes_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/internal/kubetest"
	"dbcloud/runtime/kubernetes"
)

// exposedService is a service as the domain hands it to the runtime: with
// the endpoint and pooler port it claimed.
func exposedService(port, poolerPort int) *dbcloud.Service {
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvDev, Pooler: true, Running: true})
	svc.Endpoint = &dbcloud.Endpoint{Host: "db.example.test", Port: port}
	svc.PoolerPort = poolerPort
	return svc
}

func getService(t *testing.T, ctx context.Context, ns, name string) *corev1.Service {
	t.Helper()
	var s corev1.Service
	err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// assignLoadBalancer writes the address a cloud provider's controller
// writes into a LoadBalancer Service's status.
func assignLoadBalancer(t *testing.T, ctx context.Context, s *corev1.Service, ingress corev1.LoadBalancerIngress) {
	t.Helper()
	if err := kubetest.WriteStatus(ctx, shared.client, s, func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{ingress}
	}); err != nil {
		t.Fatal(err)
	}
}

// TestExposeLoadBalancer: a service, its pooler and a read replica set get
// a LoadBalancer Service each, accepted by the apiserver, owned by their
// Cluster; the service is not running until the provider assigns the
// addresses, and then its endpoints are those addresses; disabling the
// pooler and deleting the service remove them.
func TestExposeLoadBalancer(t *testing.T) {
	annotations := map[string]string{"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}
	rt := newRuntime(t, kubernetes.Config{Expose: kubernetes.ExposeLoadBalancer, ExposeAnnotations: annotations})
	ctx := testContext(t)
	svc := exposedService(31234, 31235)
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ns, name := rt.Namespace(svc.ProjectID), kubernetes.ClusterName(svc)
	var cluster apiv1.Cluster
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &cluster); err != nil {
		t.Fatal(err)
	}
	primary := getService(t, ctx, ns, kubernetes.ExternalName(name))
	pooler := getService(t, ctx, ns, kubernetes.ExternalName(kubernetes.PoolerName(name)))
	if primary == nil || pooler == nil {
		t.Fatalf("exposing Services: primary %v, pooler %v", primary != nil, pooler != nil)
	}
	for _, c := range []struct {
		s        *corev1.Service
		port     int32
		selector map[string]string
	}{
		{primary, 31234, map[string]string{"cnpg.io/cluster": name, "cnpg.io/instanceRole": "primary"}},
		{pooler, 31235, map[string]string{"cnpg.io/poolerName": kubernetes.PoolerName(name)}},
	} {
		s := c.s
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != c.port ||
			s.Spec.Ports[0].TargetPort.IntValue() != 5432 {
			t.Errorf("%s: type %s ports %+v", s.Name, s.Spec.Type, s.Spec.Ports)
		}
		for k, v := range c.selector {
			if s.Spec.Selector[k] != v {
				t.Errorf("%s: selector %v, want %s=%s", s.Name, s.Spec.Selector, k, v)
			}
		}
		if s.Annotations["service.beta.kubernetes.io/aws-load-balancer-internal"] != "true" {
			t.Errorf("%s: annotations %v", s.Name, s.Annotations)
		}
		if !ownedBy(s, &cluster) {
			t.Errorf("%s: not owned by the Cluster: %+v", s.Name, s.OwnerReferences)
		}
	}

	// CNPG reports the cluster healthy; the load balancers have no address.
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 1))
	obs, err := rt.CheckService(ctx, svc, false)
	if err != nil {
		t.Fatal(err)
	}
	if obs.Running || !strings.Contains(obs.Reason, "load balancer") || obs.Endpoint != nil {
		t.Fatalf("before the load balancer has an address: running %v, endpoint %v, reason %q", obs.Running, obs.Endpoint, obs.Reason)
	}
	assignLoadBalancer(t, ctx, primary, corev1.LoadBalancerIngress{IP: "203.0.113.7"})
	if obs, _ = rt.CheckService(ctx, svc, false); obs.Running {
		t.Fatalf("running while the pooler's load balancer has no address: %+v", obs)
	}
	tcp := corev1.ProtocolTCP
	assignLoadBalancer(t, ctx, pooler, corev1.LoadBalancerIngress{Hostname: "pooler.lb.example.test",
		Ports: []corev1.PortStatus{{Port: 6432, Protocol: tcp}}})
	obs, err = rt.CheckService(ctx, svc, false)
	if err != nil || !obs.Running {
		t.Fatalf("with addresses: %v %+v", err, obs)
	}
	if *obs.Endpoint != (dbcloud.Endpoint{Host: "203.0.113.7", Port: 31234}) ||
		*obs.PoolerEndpoint != (dbcloud.Endpoint{Host: "pooler.lb.example.test", Port: 6432}) {
		t.Fatalf("endpoints %+v, pooler %+v", obs.Endpoint, obs.PoolerEndpoint)
	}

	// A read replica set's nodes behind one more.
	set := &dbcloud.ReadReplicaSet{ID: dbcloud.NewID(), ProjectID: svc.ProjectID, ServiceID: svc.ID,
		Spec:     dbcloud.ReadReplicaSetSpec{Nodes: 2, Size: dbcloud.DefaultSize},
		Endpoint: &dbcloud.Endpoint{Host: "db.example.test", Port: 31236}}
	if err := rt.ApplyReplicaSet(ctx, svc, set); err != nil {
		t.Fatal(err)
	}
	rs := getService(t, ctx, ns, kubernetes.ExternalName(kubernetes.ReplicaClusterName(set)))
	if rs == nil || rs.Spec.Ports[0].Port != 31236 || rs.Spec.Selector["cnpg.io/podRole"] != "instance" ||
		rs.Spec.Selector["cnpg.io/cluster"] != kubernetes.ReplicaClusterName(set) {
		t.Fatalf("replica set's Service: %+v", rs)
	}
	if err := rt.DeleteReplicaSet(ctx, svc, set); err != nil {
		t.Fatal(err)
	}
	if getService(t, ctx, ns, rs.Name) != nil {
		t.Fatal("the replica set's Service outlived it")
	}

	svc.Spec.Pooler = false
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if getService(t, ctx, ns, pooler.Name) != nil {
		t.Fatal("the pooler's Service outlived the pooler")
	}
	if err := rt.DeleteService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if getService(t, ctx, ns, primary.Name) != nil {
		t.Fatal("the service's Service outlived it")
	}
}

// TestExposeNodePort: the claimed port is the node port, so the endpoint
// claimed at creation is the one reported; a port outside the apiserver's
// node port range is refused for good, not retried.
func TestExposeNodePort(t *testing.T) {
	// The endpoint's host is made up: the probe answers as kube-proxy would.
	var accepting atomic.Bool
	probe := func(_ context.Context, addr string) error {
		if addr != "db.example.test:30123" || !accepting.Load() {
			return fmt.Errorf("dial tcp %s: connection refused", addr)
		}
		return nil
	}
	rt := newRuntime(t, kubernetes.Config{Expose: kubernetes.ExposeNodePort, Probe: probe})
	ctx := testContext(t)
	svc := exposedService(30123, 0)
	svc.Spec.Pooler = false
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ns, name := rt.Namespace(svc.ProjectID), kubernetes.ClusterName(svc)
	s := getService(t, ctx, ns, kubernetes.ExternalName(name))
	if s == nil || s.Spec.Type != corev1.ServiceTypeNodePort || s.Spec.Ports[0].NodePort != 30123 {
		t.Fatalf("NodePort Service: %+v", s)
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 1))
	obs, err := rt.CheckService(ctx, svc, false)
	if err != nil || !obs.Running || *obs.Endpoint != (dbcloud.Endpoint{Host: "db.example.test", Port: 30123}) {
		t.Fatalf("%v %+v", err, obs)
	}

	// CNPG says healthy before the kubelet's readiness probe marks the pod
	// Ready: while the Service's endpoint is not ready, the service is not
	// running (it would refuse connections at its node port).
	ready := false
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: kubernetes.ExternalName(name) + "-x1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: kubernetes.ExternalName(name)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}
	if err := shared.client.Create(ctx, slice); err != nil {
		t.Fatal(err)
	}
	obs, err = rt.CheckService(ctx, svc, false)
	if err != nil || obs.Running || !strings.Contains(obs.Reason, "ready endpoint") {
		t.Fatalf("not-ready endpoint: %v %+v", err, obs)
	}
	ready = true
	slice.Endpoints[0].Conditions.Ready = &ready // Create decoded the server's copy into slice
	if err := shared.client.Update(ctx, slice); err != nil {
		t.Fatal(err)
	}
	// Ready in the EndpointSlice, but kube-proxy has not programmed the
	// node port yet: still not running.
	obs, err = rt.CheckService(ctx, svc, false)
	if err != nil || obs.Running || !strings.Contains(obs.Reason, "accept connections") {
		t.Fatalf("ready endpoint, refusing node port: %v %+v", err, obs)
	}
	accepting.Store(true)
	obs, err = rt.CheckService(ctx, svc, false)
	if err != nil || !obs.Running {
		t.Fatalf("ready endpoint: %v %+v", err, obs)
	}

	out := exposedService(5500, 0)
	out.Spec.Pooler = false
	err = rt.Apply(ctx, out)
	if !dbcloud.IsTerminal(err) || !strings.Contains(err.Error(), "Kubernetes refused") {
		t.Fatalf("node port 5500: %v", err)
	}
}

// TestExposeClusterIP: nothing is made, and the endpoint is CNPG's
// cluster-internal Service.
func TestExposeClusterIP(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{Expose: kubernetes.ExposeClusterIP})
	ctx := testContext(t)
	svc := exposedService(31240, 31241)
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ns, name := rt.Namespace(svc.ProjectID), kubernetes.ClusterName(svc)
	var list corev1.ServiceList
	if err := shared.client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("Services made without exposure: %d", len(list.Items))
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 1))
	obs, err := rt.CheckService(ctx, svc, false)
	if err != nil || !obs.Running {
		t.Fatalf("%v %+v", err, obs)
	}
	if *obs.Endpoint != (dbcloud.Endpoint{Host: name + "-rw." + ns + ".svc", Port: 5432}) ||
		*obs.PoolerEndpoint != (dbcloud.Endpoint{Host: kubernetes.PoolerName(name) + "." + ns + ".svc", Port: 5432}) {
		t.Fatalf("endpoints %+v %+v", obs.Endpoint, obs.PoolerEndpoint)
	}
}
