// Package kubernetes is a dbcloud runtime that runs services on a
// Kubernetes cluster by driving CloudNativePG (CNPG): it writes CNPG
// objects through controller-runtime's client with CNPG's own API types and
// reads CNPG's status back. It never schedules anything itself; CNPG's
// operator and the cluster do (docs/kubernetes.md).
//
// A project is a namespace (Config.NamespacePrefix + project ID), so
// Kubernetes' RBAC, quotas and network policies can be applied per project.
// Every object made for a service carries the labels of Labels and an owner
// reference to the service's Cluster, and DeleteService also deletes them by
// label, so nothing is left behind even where no garbage collector runs.
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
)

// Name is how errors and logs name this runtime.
const Name = "kubernetes"

// Config is what the runtime needs.
type Config struct {
	// Client talks to the cluster; its scheme must know CNPG's types (Scheme).
	Client client.Client
	// Logs reads pod logs; nil answers log requests with an empty page.
	Logs PodLogReader
	// NamespacePrefix names a project's namespace with the project ID
	// appended (default "dbcloud-").
	NamespacePrefix string
	// ImageName is the PostgreSQL image of the Clusters of services on
	// ImageMajor; empty leaves CNPG's default.
	ImageName string
	// ImageMajor is ImageName's PostgreSQL major version (default
	// DefaultImageMajor), which services recorded without a version run.
	ImageMajor int
	// Images holds the images of the other PostgreSQL versions services
	// may choose, by major (decisions.md section 11): a service's Cluster
	// runs its version's image.
	Images map[int]string
	// StorageSize is each instance's volume (default "10Gi").
	StorageSize string
	// StorageClass is the class of the volumes; empty uses the cluster's default.
	StorageClass string
	// Extensions lists the extensions ImageName ships, which the addons may
	// create. Nothing is assumed: an image without them answers
	// ADDON_UNAVAILABLE.
	Extensions map[string]bool
	// Guard says the images ship dbcloud_guard (scripts/kube-images.sh
	// builds them so): every instance preloads it, which keeps tenants
	// inside their database as on the host (docs/security.md). Off by
	// default: an image without the library would not start.
	Guard bool
	// ObjectStore, when set, names a barman-cloud plugin ObjectStore in
	// each project's namespace: services archive WAL to it and take
	// scheduled backups through the plugin, which is what PITR forks need.
	ObjectStore string
	// ObjectStoreFrom, when set, is the namespace of an ObjectStore named
	// ObjectStore that serves as a template: the runtime copies it, with
	// the Secrets it names, into each project's namespace (objectstore.go).
	// Empty: the ObjectStore in each project's namespace is the operator's.
	ObjectStoreFrom string
	// BackupSchedule is the six-field cron schedule of the ScheduledBackup
	// (default daily at 00:00:00).
	BackupSchedule string
	// PollInterval is how often Ensure* re-reads CNPG's status while it
	// waits for a change to be made (default 2 s).
	PollInterval time.Duration
	// WaitTimeout bounds how long Ensure* wait for CNPG (default 15 min).
	WaitTimeout time.Duration
	// Expose says how users outside the cluster reach services (expose.go);
	// empty is ExposeClusterIP.
	Expose Expose
	// ExposeAnnotations go on every Service made by Expose: a provider's
	// internal load balancer, for example.
	ExposeAnnotations map[string]string
	// Metrics reads the instances' exporters; nil leaves services unmeasured.
	Metrics PodMetricsReader
	// Probe checks that an endpoint accepts a TCP connection before a
	// service is READY on a cluster that keeps endpoints; nil dials it.
	Probe  func(ctx context.Context, addr string) error
	Logger *slog.Logger
}

// Runtime implements dbcloud.Runtime, dbcloud.Provisioner and
// dbcloud.ReplicaSetProvisioner on CNPG.
type Runtime struct {
	cfg Config
	c   client.Client
	log *slog.Logger
}

// The capabilities of the contract (dbcloud/runtime.go) this runtime has:
// CNPG runs replica clusters and restores, so read replica sets and fork
// windows map onto it. It has no capacity report (the cluster's scheduler
// decides placement), and snapshots and restore checks are CNPG's backups,
// not mapped yet (issue 32); nor does it upgrade a major version in place
// (no Upgrader: upgradeService answers 409 naming this runtime). Its
// password changes go through CNPG's controllers, hence a budget of their
// own (PasswordBudget). TestCapabilities keeps this list true.
var (
	_ dbcloud.Runtime               = (*Runtime)(nil)
	_ dbcloud.Provisioner           = (*Runtime)(nil)
	_ dbcloud.ReplicaSetProvisioner = (*Runtime)(nil)
	_ dbcloud.Backups               = (*Runtime)(nil)
	_ dbcloud.PasswordBudgeter      = (*Runtime)(nil)
)

// Scheme returns a scheme with Kubernetes' built-in types and CNPG's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := apiv1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// New returns a runtime on cfg.Client.
func New(cfg Config) (*Runtime, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubernetes runtime: no client")
	}
	if cfg.NamespacePrefix == "" {
		cfg.NamespacePrefix = "dbcloud-"
	}
	if cfg.StorageSize == "" {
		cfg.StorageSize = "10Gi"
	}
	if cfg.BackupSchedule == "" {
		cfg.BackupSchedule = "0 0 0 * * *"
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 2 * time.Second
	}
	if cfg.WaitTimeout <= 0 {
		cfg.WaitTimeout = 15 * time.Minute
	}
	if cfg.Probe == nil {
		cfg.Probe = dialProbe
	}
	if cfg.Expose == "" {
		cfg.Expose = ExposeClusterIP
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Runtime{cfg: cfg, c: cfg.Client, log: cfg.Logger}, nil
}

// RESTConfig loads a kubeconfig file; an empty path means the in-cluster
// configuration of a pod's service account.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// NewForConfig returns a runtime talking to the cluster of rc, with pod logs.
func NewForConfig(rc *rest.Config, cfg Config) (*Runtime, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	cfg.Client = c
	if cfg.Logs == nil {
		if cfg.Logs, err = newPodLogs(rc); err != nil {
			return nil, err
		}
	}
	if cfg.Metrics == nil {
		if cfg.Metrics, err = newPodMetrics(rc); err != nil {
			return nil, err
		}
	}
	return New(cfg)
}

// DefaultImageMajor is the PostgreSQL major version of ImageName when the
// configuration does not say: what scripts/kube-images.sh builds.
const DefaultImageMajor = 15

// PGVersions lists ImageMajor and the majors of Images, each with the
// extensions the images ship. The full versions are the images', which
// the runtime does not read.
func (rt *Runtime) PGVersions() []dbcloud.PGVersion {
	majors := []int{rt.imageMajor()}
	for major := range rt.cfg.Images {
		if !slices.Contains(majors, major) {
			majors = append(majors, major)
		}
	}
	slices.Sort(majors)
	out := make([]dbcloud.PGVersion, len(majors))
	for i, major := range majors {
		out[i] = dbcloud.PGVersion{Major: major, Extensions: rt.cfg.Extensions}
	}
	return out
}

func (rt *Runtime) imageMajor() int {
	if rt.cfg.ImageMajor == 0 {
		return DefaultImageMajor
	}
	return rt.cfg.ImageMajor
}

// imageFor is the image of a Cluster running PostgreSQL major: ImageName
// for ImageMajor and for services recorded without a version; "" leaves
// CNPG's default.
func (rt *Runtime) imageFor(major int) string {
	if img, ok := rt.cfg.Images[major]; ok && major != dbcloud.PGVersionUnknown {
		return img
	}
	return rt.cfg.ImageName
}

// PortFree is always true: services are reached through Kubernetes
// Services, not host ports.
func (rt *Runtime) PortFree(int) bool { return true }

// Kinds this runtime owns, for deletion by label.
func ownedLists() []client.ObjectList {
	return []client.ObjectList{
		&apiv1.PoolerList{}, &apiv1.ScheduledBackupList{}, &apiv1.BackupList{},
		&apiv1.ClusterList{}, &corev1.SecretList{}, &corev1.ServiceList{},
	}
}
