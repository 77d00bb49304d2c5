package kubernetes

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"dbcloud"
)

// Expose says how users outside the cluster reach a service: the Services
// CNPG makes (NAME-rw, NAME-r, the Pooler's) are ClusterIP, reachable only
// from inside the cluster.
type Expose string

const (
	// ExposeClusterIP makes nothing: the endpoints reported are CNPG's
	// cluster-internal Services (clients inside the cluster only).
	ExposeClusterIP Expose = "clusterip"
	// ExposeLoadBalancer makes a Service of type LoadBalancer per service,
	// pooler and read replica set, listening on the port dbcloud claimed
	// for it; the endpoint's host is the load balancer's address once the
	// provider assigns it (status.loadBalancer.ingress), and until then
	// the service is not READY.
	ExposeLoadBalancer Expose = "loadbalancer"
	// ExposeNodePort makes a Service of type NodePort whose node port is
	// the port dbcloud claimed, so the endpoint it reports at creation
	// (--public-host, a node's address, and that port) is the one users
	// reach. The claimed ports must then lie in the apiserver's
	// --service-node-port-range (30000-32767 by default).
	ExposeNodePort Expose = "nodeport"
)

// ParseExpose checks a --kube-expose value.
func ParseExpose(s string) (Expose, error) {
	switch e := Expose(s); e {
	case ExposeClusterIP, ExposeLoadBalancer, ExposeNodePort:
		return e, nil
	case "":
		return ExposeClusterIP, nil
	}
	return "", fmt.Errorf("want loadbalancer, nodeport or clusterip, not %q", s)
}

// postgresPort is where CNPG's instances and PgBouncer listen in their pods.
const postgresPort = 5432

// ExternalName is the Service that exposes a cluster's primary, a replica
// Cluster's instances or a Pooler (named after it) outside the cluster.
func ExternalName(name string) string { return name + "-external" }

// exposure is one thing to expose: the pods it reaches and the port
// dbcloud claimed for it.
type exposure struct {
	name     string // the Cluster or Pooler it is named after
	selector map[string]string
	port     int
	// host is the claimed endpoint's host (--public-host): a node's
	// address, under ExposeNodePort.
	host string
	// internal is CNPG's own Service for it, the endpoint under ExposeClusterIP.
	internal string
}

// primaryExposure reaches a service's current primary: CNPG labels it, and
// moves the label on failover, so the Service follows the primary as the
// local runtime's endpoint does.
func primaryExposure(cluster string, port int) exposure {
	return exposure{name: cluster, port: port, internal: cluster + "-rw",
		selector: map[string]string{clusterLabel: cluster, "cnpg.io/instanceRole": "primary"}}
}

// instancesExposure reaches every instance of a replica Cluster (a read
// replica set: all of them are read-only standbys).
func instancesExposure(cluster string, port int) exposure {
	return exposure{name: cluster, port: port, internal: cluster + "-r",
		selector: map[string]string{clusterLabel: cluster, "cnpg.io/podRole": "instance"}}
}

// poolerExposure reaches a Pooler's PgBouncer pods.
func poolerExposure(pooler string, port int) exposure {
	return exposure{name: pooler, port: port, internal: pooler,
		selector: map[string]string{"cnpg.io/poolerName": pooler}}
}

// ensureExposed makes (or, with want false, removes) the Service that
// exposes e, owned by the Cluster so deleting the Cluster removes it.
func (rt *Runtime) ensureExposed(ctx context.Context, cluster *apiv1.Cluster, e exposure, want bool, labels map[string]string) error {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: ExternalName(e.name), Namespace: cluster.Namespace}}
	if !want || rt.cfg.Expose == ExposeClusterIP {
		return client.IgnoreNotFound(rt.c.Delete(ctx, s))
	}
	port := e.port
	if port <= 0 {
		port = postgresPort
	}
	err := rt.upsert(ctx, s, func() error {
		s.Labels = mergeLabels(s.Labels, labels)
		s.Annotations = mergeLabels(s.Annotations, rt.cfg.ExposeAnnotations)
		s.Spec.Selector = e.selector
		p := corev1.ServicePort{Name: "postgres", Protocol: corev1.ProtocolTCP, Port: int32(port), TargetPort: intstr.FromInt32(postgresPort)}
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		if rt.cfg.Expose == ExposeNodePort {
			s.Spec.Type = corev1.ServiceTypeNodePort
			p.NodePort = int32(port)
		}
		s.Spec.Ports = []corev1.ServicePort{p}
		return controllerutil.SetControllerReference(cluster, s, rt.c.Scheme())
	})
	if apierrors.IsInvalid(err) {
		// A node port outside the apiserver's range, an annotation the
		// provider refuses: retrying cannot fix it.
		return dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "Kubernetes refused the Service exposing %s: %v", e.name, err))
	}
	return err
}

// endpoint is where users reach e; with none, a reason says why not yet
// (no load balancer address).
func (rt *Runtime) endpoint(ctx context.Context, ns string, e exposure) (*dbcloud.Endpoint, string, error) {
	switch rt.cfg.Expose {
	case ExposeNodePort:
		return &dbcloud.Endpoint{Host: e.host, Port: e.port}, "", nil
	case ExposeLoadBalancer:
	default:
		return &dbcloud.Endpoint{Host: e.internal + "." + ns + ".svc", Port: postgresPort}, "", nil
	}
	var s corev1.Service
	if err := rt.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: ExternalName(e.name)}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("The load balancer Service %s does not exist.", ExternalName(e.name)), nil
		}
		return nil, "", err
	}
	return lbEndpoint(&s)
}

// lbEndpoint reads the address the provider assigned to a LoadBalancer
// Service: the first ingress's IP or host name, and its port where the
// provider reports one (else the Service's port).
func lbEndpoint(s *corev1.Service) (*dbcloud.Endpoint, string, error) {
	for _, in := range s.Status.LoadBalancer.Ingress {
		host := in.IP
		if host == "" {
			host = in.Hostname
		}
		if host == "" {
			continue
		}
		port := postgresPort
		if len(s.Spec.Ports) > 0 {
			port = int(s.Spec.Ports[0].Port)
		}
		for _, p := range in.Ports {
			if p.Protocol == corev1.ProtocolTCP && p.Error == nil && p.Port > 0 {
				port = int(p.Port)
				break
			}
		}
		return &dbcloud.Endpoint{Host: host, Port: port}, "", nil
	}
	return nil, fmt.Sprintf("Waiting for the load balancer of Service %s/%s to get an address.", s.Namespace, s.Name), nil
}

// serviceOf is the Service that carries e's traffic: the exposing one, or
// CNPG's own under ExposeClusterIP.
func (rt *Runtime) serviceOf(e exposure) string {
	if rt.cfg.Expose == ExposeClusterIP {
		return e.internal
	}
	return ExternalName(e.name)
}

// serving says why the Service carrying e sends no traffic yet, or "" when
// it does. CNPG reports an instance healthy from its instance manager
// before the kubelet's readiness probe marks the pod Ready, and a Service
// only sends traffic to Ready pods: against real pods, a service was READY
// while its NodePort refused connections for several seconds. The
// endpoints are the EndpointSlices the control plane keeps for the
// Service; when there is none at all, nothing keeps them (an apiserver
// without controllers, as in the tests that write CNPG's status by hand),
// and there is nothing to wait for.
//
// It reports whether the Service has endpoints kept at all (kept), so the
// caller knows a real cluster carries the traffic.
func (rt *Runtime) serving(ctx context.Context, ns string, e exposure) (wait string, kept bool, err error) {
	name := rt.serviceOf(e)
	var slices discoveryv1.EndpointSliceList
	if err := rt.c.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return "", false, err
	}
	if len(slices.Items) == 0 {
		return "", false, nil
	}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			// An unset ready condition means ready (the EndpointSlice API).
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return "", true, nil
			}
		}
	}
	return fmt.Sprintf("Waiting for Service %s/%s to have a ready endpoint.", ns, name), true, nil
}

// endpointProbe bounds the check that an endpoint accepts connections.
const endpointProbe = 2 * time.Second

// reachable is endpoint and, once it has one, serving, and then the
// endpoint itself accepting a TCP connection: a ready endpoint in the
// EndpointSlice is not yet a rule in kube-proxy's tables (against real
// pods a NodePort refused connections for a moment after it), and READY
// promises a psql that connects.
func (rt *Runtime) reachable(ctx context.Context, ns string, e exposure) (*dbcloud.Endpoint, string, error) {
	ep, wait, err := rt.endpoint(ctx, ns, e)
	if err != nil || wait != "" {
		return ep, wait, err
	}
	wait, kept, err := rt.serving(ctx, ns, e)
	if err != nil || wait != "" || !kept || ep == nil {
		return ep, wait, err
	}
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port))
	if err := rt.cfg.Probe(ctx, addr); err != nil {
		return ep, fmt.Sprintf("Waiting for %s to accept connections.", addr), nil
	}
	return ep, "", nil
}

// dialProbe is Config.Probe's default: a TCP connection, closed at once.
func dialProbe(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: endpointProbe}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// observeEndpoints fills the observation's endpoints for a running cluster;
// a load balancer without an address yet, or a Service with no ready
// endpoint, makes it not running: a READY service must accept connections
// at its endpoint.
func (rt *Runtime) observeEndpoints(ctx context.Context, obs *dbcloud.Observation, ns string, main exposure, pooler *exposure) error {
	if !obs.Running {
		return nil
	}
	ep, wait, err := rt.reachable(ctx, ns, main)
	if err != nil {
		return err
	}
	obs.Endpoint = ep
	if pooler != nil {
		pep, pwait, err := rt.reachable(ctx, ns, *pooler)
		if err != nil {
			return err
		}
		if wait == "" {
			wait = pwait
		}
		obs.PoolerEndpoint = pep
	}
	if wait != "" {
		obs.Running, obs.Reason = false, wait
	}
	return nil
}
