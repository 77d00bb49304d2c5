package kubernetes

import (
	"fmt"
	"strings"

	"dbcloud/sizing"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"dbcloud"
)

// Labels put on every object this runtime makes.
const (
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	LabelProject    = "dbcloud.io/project"
	LabelService    = "dbcloud.io/service"
	LabelReplicaSet = "dbcloud.io/replica-set"
	managedBy       = "dbcloud"

	// HibernationAnnotation is CNPG's declarative hibernation switch
	// (docs/src/declarative_hibernation.md).
	HibernationAnnotation = "cnpg.io/hibernation"
	hibernationOn         = "on"
	// clusterLabel is the label CNPG puts on a cluster's pods and jobs.
	clusterLabel = "cnpg.io/cluster"

	// BarmanPlugin is the barman-cloud plugin's name in Cluster.spec.plugins.
	BarmanPlugin = "barman-cloud.cloudnative-pg.io"

	owner    = "tsdbadmin"
	database = "tsdb"
	// originSource is the external cluster a fork or replica set reads from.
	originSource = "origin"
	// smartShutdownSeconds is how long a stopping instance lets its
	// sessions end before it ends them (setCommon).
	smartShutdownSeconds = 1
)

// Namespace is the namespace of a project.
func (rt *Runtime) Namespace(projectID string) string { return rt.cfg.NamespacePrefix + projectID }

// ClusterName is the CNPG Cluster of a service. IDs may start with a
// digit; Service names (CNPG makes NAME-rw) must start with a letter.
func ClusterName(svc *dbcloud.Service) string { return "svc-" + svc.ID }

// ReplicaClusterName is the replica Cluster of a read replica set.
func ReplicaClusterName(set *dbcloud.ReadReplicaSet) string { return "rs-" + set.ID }

// PoolerName is the Pooler of a cluster; CNPG forbids the cluster's own name.
func PoolerName(cluster string) string { return cluster + "-pooler" }

// SecretName holds tsdbadmin's SCRAM verifier: initdb and the managed role
// take the password from it, and PostgreSQL stores a verifier as given, so
// the plaintext never reaches the cluster.
func SecretName(cluster string) string { return cluster + "-tsdbadmin" }

// nowBackupName is the online Backup a NOW fork restores from.
func nowBackupName(fork string) string { return fork + "-fork-source" }

// pitrBackupName is the online Backup that archives a running parent's WAL
// up to a PITR fork's request (archivePastNow).
func pitrBackupName(fork string) string { return fork + "-fork-wal" }

func serviceLabels(svc *dbcloud.Service) map[string]string {
	return map[string]string{LabelManagedBy: managedBy, LabelProject: svc.ProjectID, LabelService: svc.ID}
}

func replicaSetLabels(set *dbcloud.ReadReplicaSet) map[string]string {
	return map[string]string{LabelManagedBy: managedBy, LabelProject: set.ProjectID, LabelService: set.ServiceID, LabelReplicaSet: set.ID}
}

// resourcesFor is the pod resources of a size, with the local runtime's
// ratios: requests equal limits, so CNPG's pods get the Guaranteed QoS
// class and the settings derived from the memory hold.
func resourcesFor(size dbcloud.Size) (corev1.ResourceRequirements, map[string]string) {
	r := sizing.For(size)
	list := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(int64(r.CPUMillis), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(r.MemoryBytes, resource.BinarySI),
	}
	return corev1.ResourceRequirements{Requests: list, Limits: list.DeepCopy()}, r.Settings
}

// setClusterSpec writes into c what the service asks for. It leaves alone
// what CNPG owns once the cluster exists (bootstrap) and what it defaults.
func (rt *Runtime) setClusterSpec(c *apiv1.Cluster, svc *dbcloud.Service, bootstrap *apiv1.BootstrapConfiguration) {
	c.Labels = mergeLabels(c.Labels, serviceLabels(svc))
	setHibernation(c, !svc.Spec.Running)
	s := &c.Spec
	s.Instances = 1 + svc.Spec.Replicas
	rt.setCommon(s, svc.Spec.Size, svc.Spec.PGVersion)
	s.PostgresConfiguration.Synchronous = nil
	if svc.Spec.SyncReplicas > 0 {
		s.PostgresConfiguration.Synchronous = &apiv1.SynchronousReplicaConfiguration{
			Method: apiv1.SynchronousReplicaConfigurationMethodAny, Number: svc.Spec.SyncReplicas,
		}
	}
	var sql []string
	for _, a := range svc.Spec.Addons {
		if a == dbcloud.AddonTimeSeries {
			s.PostgresConfiguration.AdditionalLibraries = append(s.PostgresConfiguration.AdditionalLibraries, "timescaledb")
		}
		if ext := a.Extension(); ext != "" {
			sql = append(sql, fmt.Sprintf("CREATE EXTENSION IF NOT EXISTS %s", ext))
		}
	}
	// The password follows the Secret through CNPG's managed roles, so an
	// updatePassword is a Secret write (SetPassword).
	s.Managed = &apiv1.ManagedConfiguration{Roles: []apiv1.RoleConfiguration{{
		Name: owner, Ensure: apiv1.EnsurePresent, Login: true,
		PasswordSecret: &apiv1.LocalObjectReference{Name: SecretName(c.Name)},
	}}}
	if s.Bootstrap == nil {
		s.Bootstrap = bootstrap
		if s.Bootstrap.InitDB != nil {
			s.Bootstrap.InitDB.PostInitApplicationSQL = sql
		}
	}
	s.Plugins = nil
	if rt.cfg.ObjectStore != "" {
		s.Plugins = []apiv1.PluginConfiguration{{
			Name: BarmanPlugin, IsWALArchiver: ptr.To(true),
			Parameters: map[string]string{"barmanObjectName": rt.cfg.ObjectStore},
		}}
	}
}

// guardLibrary is dbcloud_guard's name in shared_preload_libraries.
const guardLibrary = "dbcloud_guard"

// setCommon is what a service's Cluster and a replica set's share.
func (rt *Runtime) setCommon(s *apiv1.ClusterSpec, size dbcloud.Size, major int) {
	if img := rt.imageFor(major); img != "" {
		s.ImageName = img
	}
	res, settings := resourcesFor(size)
	s.Resources = res
	s.PostgresConfiguration.Parameters = settings
	// The guard on every instance a tenant reaches, read replica sets too;
	// the addons' libraries follow (setClusterSpec).
	s.PostgresConfiguration.AdditionalLibraries = nil
	if rt.cfg.Guard {
		s.PostgresConfiguration.AdditionalLibraries = []string{guardLibrary}
	}
	// A resize restarts the standbys first, then moves the primary to an
	// updated one instead of restarting it in place.
	s.PrimaryUpdateStrategy = apiv1.PrimaryUpdateStrategyUnsupervised
	s.PrimaryUpdateMethod = apiv1.PrimaryUpdateMethodSwitchover
	// A deleted or evicted pod's PostgreSQL waits in a smart shutdown for
	// its sessions to end, 180 s by CNPG's default, refusing every new
	// connection meanwhile, and the replica is promoted only once it has
	// stopped: a pool's sessions never end, so the primary's pod deleted
	// meant three minutes without new connections. The local runtime's
	// rule instead: smart for a second, then fast (sessions ended, their
	// open transactions rolled back, every commit streamed to the
	// standbys before the server exits).
	s.SmartShutdownTimeout = ptr.To(int32(smartShutdownSeconds))
	s.StorageConfiguration.Size = rt.cfg.StorageSize
	if rt.cfg.StorageClass != "" {
		s.StorageConfiguration.StorageClass = ptr.To(rt.cfg.StorageClass)
	}
	s.EnableSuperuserAccess = ptr.To(false)
}

func setHibernation(c *apiv1.Cluster, on bool) {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	if on {
		c.Annotations[HibernationAnnotation] = hibernationOn
	} else {
		c.Annotations[HibernationAnnotation] = "off"
	}
}

func mergeLabels(have, want map[string]string) map[string]string {
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}

// initdbBootstrap makes tsdbadmin and tsdb with the Secret's password.
func initdbBootstrap(cluster string) *apiv1.BootstrapConfiguration {
	return &apiv1.BootstrapConfiguration{InitDB: &apiv1.BootstrapInitDB{
		Database: database, Owner: owner, Secret: &apiv1.LocalObjectReference{Name: SecretName(cluster)},
		DataChecksums: ptr.To(true),
	}}
}

// recoveryFrom is what a fork restores; one of its fields is set.
type recoveryFrom struct {
	// backup is a Backup object restored as it is (a volume snapshot).
	backup string
	// backupID is a backup in the parent's archive, replayed only until it
	// is consistent: the parent as that backup saw it.
	backupID string
	// targetTime is a point in the parent's archive: the newest backup
	// before it, replayed up to it.
	targetTime *metav1.Time
}

// recoveryBootstrap restores a fork. A Backup object is how CNPG restores
// a volume snapshot; what is in an object store is read through the
// plugin's external cluster (objectStoreSource), as the plugin restores.
func recoveryBootstrap(cluster string, from recoveryFrom) *apiv1.BootstrapConfiguration {
	r := &apiv1.BootstrapRecovery{Database: database, Owner: owner, Secret: &apiv1.LocalObjectReference{Name: SecretName(cluster)}}
	switch {
	case from.targetTime != nil:
		r.Source = originSource
		r.RecoveryTarget = &apiv1.RecoveryTarget{TargetTime: from.targetTime.UTC().Format("2006-01-02 15:04:05.000000-07:00")}
	case from.backupID != "":
		r.Source = originSource
		r.RecoveryTarget = &apiv1.RecoveryTarget{BackupID: from.backupID, TargetImmediate: ptr.To(true)}
	default:
		r.Backup = &apiv1.BackupSource{LocalObjectReference: apiv1.LocalObjectReference{Name: from.backup}}
	}
	return &apiv1.BootstrapConfiguration{Recovery: r}
}

// objectStoreSource reads another cluster's archive through the plugin.
func (rt *Runtime) objectStoreSource(serverName string) apiv1.ExternalCluster {
	return apiv1.ExternalCluster{Name: originSource, PluginConfiguration: &apiv1.PluginConfiguration{
		Name: BarmanPlugin, Parameters: map[string]string{"barmanObjectName": rt.cfg.ObjectStore, "serverName": serverName},
	}}
}

// streamingSource connects to another cluster of the namespace as CNPG's
// streaming_replica user, with the certificates CNPG made for it
// (docs/src/replica_cluster.md).
func streamingSource(ns, cluster string) apiv1.ExternalCluster {
	sel := func(secret, key string) *corev1.SecretKeySelector {
		return &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}
	}
	return apiv1.ExternalCluster{
		Name: originSource,
		ConnectionParameters: map[string]string{
			"host": cluster + "-rw." + ns + ".svc", "user": "streaming_replica",
			"sslmode": "verify-full", "dbname": "postgres",
		},
		SSLKey:      sel(cluster+"-replication", "tls.key"),
		SSLCert:     sel(cluster+"-replication", "tls.crt"),
		SSLRootCert: sel(cluster+"-ca", "ca.crt"),
	}
}

// poolerSpec is a PgBouncer in front of a cluster, in transaction mode as
// the local runtime's pooler is.
func poolerSpec(cluster string, typ apiv1.PoolerType, env dbcloud.Environment) apiv1.PoolerSpec {
	instances := int32(1)
	if env == dbcloud.EnvProd {
		instances = 2
	}
	return apiv1.PoolerSpec{
		Cluster: apiv1.LocalObjectReference{Name: cluster}, Type: typ, Instances: ptr.To(instances),
		PgBouncer: &apiv1.PgBouncerSpec{PoolMode: apiv1.PgBouncerPoolModeTransaction},
	}
}

func secretFor(ns, cluster, verifier string, labels map[string]string) *corev1.Secret {
	// CNPG reapplies a managed role's password when its Secret changes only
	// if the Secret carries its reload label (pkg/utils' WatchedLabelName);
	// without it a real cluster applied a new password only on an unrelated
	// reconcile, long after updatePassword's wait had given up.
	labels = mergeLabels(map[string]string{reloadLabel: "true"}, labels)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: SecretName(cluster), Namespace: ns, Labels: labels},
		Type:       corev1.SecretTypeBasicAuth,
		Data:       map[string][]byte{corev1.BasicAuthUsernameKey: []byte(owner), corev1.BasicAuthPasswordKey: []byte(verifier)},
	}
}

// validVerifier keeps anything but a SCRAM verifier out of the Secret:
// CNPG would otherwise take a plaintext as the password.
func validVerifier(v string) bool { return strings.HasPrefix(v, "SCRAM-SHA-256$") }

// reloadLabel makes CNPG watch a Secret that a Cluster refers to.
const reloadLabel = "cnpg.io/reload"

// commitMarkAnnotation on a password Secret names the PITR fork for which
// the cluster last committed a marker transaction (markCommit).
const commitMarkAnnotation = "dbcloud.io/commit-mark"
