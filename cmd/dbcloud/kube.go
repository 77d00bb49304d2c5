package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// runtimeProvisioner is what serve needs of a runtime.
type runtimeProvisioner interface {
	dbcloud.Runtime
	dbcloud.Provisioner
}

// KubeConfig is what `dbcloud serve --runtime kubernetes` is told.
type KubeConfig struct {
	// Kubeconfig is the cluster's kubeconfig; empty inside a pod (its
	// service account).
	Kubeconfig string
	Image      string
	// Images are the images of other PostgreSQL versions,
	// comma-separated major=image pairs.
	Images       string
	StorageSize  string
	StorageClass string
	ObjectStore  string
	// Guard: the images ship dbcloud_guard, which every instance preloads.
	Guard bool
	// Extensions the image ships, comma-separated (timescaledb, vector).
	Extensions string
	// Expose is loadbalancer, nodeport or clusterip (kubernetes.Expose).
	Expose string
	// ExposeAnnotations go on the exposing Services, comma-separated
	// key=value pairs.
	ExposeAnnotations string
}

func kubeFlags(fs interface {
	StringVar(p *string, name string, value string, usage string)
	BoolVar(p *bool, name string, value bool, usage string)
}, c *Config) {
	fs.StringVar(&c.Runtime, "runtime", "local", "where services run: local (processes on this host) or kubernetes (CloudNativePG clusters; docs/kubernetes.md)")
	fs.StringVar(&c.Kube.Kubeconfig, "kubeconfig", "", "kubeconfig of the cluster for --runtime kubernetes (empty: the pod's service account)")
	fs.StringVar(&c.Kube.Image, "kube-image", "", "PostgreSQL image of CloudNativePG clusters (empty: CloudNativePG's default)")
	fs.StringVar(&c.Kube.Images, "kube-images", "", "comma-separated major=image pairs: the PostgreSQL images of versions besides --kube-image's 15 that services may choose (17=dbcloud.local/postgresql:17)")
	fs.StringVar(&c.Kube.StorageSize, "kube-storage-size", "10Gi", "volume size of each CloudNativePG instance")
	fs.StringVar(&c.Kube.StorageClass, "kube-storage-class", "", "storage class of the volumes (empty: the cluster's default)")
	fs.StringVar(&c.Kube.Extensions, "kube-extensions", "", "comma-separated extensions --kube-image ships, which addons may create (timescaledb, vector); none by default, so addons answer ADDON_UNAVAILABLE")
	fs.StringVar(&c.Kube.Expose, "kube-expose", string(kubernetes.ExposeLoadBalancer), "how users outside the cluster reach services: loadbalancer (a LoadBalancer Service each; the endpoint is its address once assigned), nodeport (the claimed port as node port on --public-host; --port-min/--port-max inside the node port range) or clusterip (cluster-internal addresses only)")
	fs.StringVar(&c.Kube.ExposeAnnotations, "kube-expose-annotations", "", "comma-separated key=value annotations of the exposing Services (a provider's internal load balancer, say)")
	fs.BoolVar(&c.Kube.Guard, "kube-guard", false, "the PostgreSQL images ship dbcloud_guard (scripts/kube-images.sh's do): every instance preloads it, keeping tenants inside their database as on this host's runtime; off by default, since an image without it would not start")
	fs.StringVar(&c.Kube.ObjectStore, "kube-object-store", "", "barman-cloud ObjectStore for WAL archives and backups: NAME, made by the operator in each project's namespace, or NAMESPACE/NAME, a template dbcloud copies (with its credentials Secrets) into each project's namespace, archiving under destinationPath/<namespace> (empty: none, so no PITR forks)")
}

// kubernetesRuntime runs services as CloudNativePG clusters; VPCs are
// refused with UNSUPPORTED.
func (m *Main) kubernetesRuntime(context.Context) (runtimeProvisioner, dbcloud.Network, error) {
	k := m.Config.Kube
	rc, err := kubernetes.RESTConfig(k.Kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	exts := map[string]bool{}
	for _, e := range strings.Split(k.Extensions, ",") {
		if e = strings.TrimSpace(e); e != "" {
			exts[e] = true
		}
	}
	images, err := parseImages(k.Images)
	if err != nil {
		return nil, nil, fmt.Errorf("--kube-images: %w", err)
	}
	expose, err := kubernetes.ParseExpose(k.Expose)
	if err != nil {
		return nil, nil, fmt.Errorf("--kube-expose: %w", err)
	}
	annotations := map[string]string{}
	for _, kv := range strings.Split(k.ExposeAnnotations, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		key, value, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(key) == "" {
			return nil, nil, fmt.Errorf("--kube-expose-annotations: %q is not key=value", kv)
		}
		annotations[strings.TrimSpace(key)] = strings.TrimSpace(value)
	}
	// NAMESPACE/NAME is a template; a bare NAME is already in each namespace.
	storeFrom, store, ok := strings.Cut(k.ObjectStore, "/")
	if !ok {
		storeFrom, store = "", k.ObjectStore
	} else if storeFrom == "" || store == "" || strings.Contains(store, "/") {
		return nil, nil, fmt.Errorf("--kube-object-store: %q is neither NAME nor NAMESPACE/NAME", k.ObjectStore)
	}
	rt, err := kubernetes.NewForConfig(rc, kubernetes.Config{
		Extensions: exts, ImageName: k.Image, Images: images, StorageSize: k.StorageSize, StorageClass: k.StorageClass,
		ObjectStore: store, ObjectStoreFrom: storeFrom, Guard: k.Guard, Expose: expose, ExposeAnnotations: annotations, Logger: m.Logger,
	})
	if err != nil {
		return nil, nil, err
	}
	return rt, kubernetes.Network{}, nil
}

// parseImages reads --kube-images: "17=image,18=image".
func parseImages(s string) (map[int]string, error) {
	out := map[int]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		major, image, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(strings.TrimSpace(major))
		if !ok || err != nil || n < 10 || strings.TrimSpace(image) == "" {
			return nil, fmt.Errorf("%q is not major=image", kv)
		}
		out[n] = strings.TrimSpace(image)
	}
	return out, nil
}
