package kubernetes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// objects is what a test reads back of a service after an operation.
type objects struct {
	ns      string
	cluster *apiv1.Cluster
	secret  *corev1.Secret
	pooler  *apiv1.Pooler // nil when there is none
	sched   *apiv1.ScheduledBackup
}

func read(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) objects {
	t.Helper()
	o := objects{ns: rt.Namespace(svc.ProjectID), cluster: &apiv1.Cluster{}, secret: &corev1.Secret{}}
	name := kubernetes.ClusterName(svc)
	get := func(n string, obj client.Object) bool {
		err := shared.client.Get(ctx, types.NamespacedName{Namespace: o.ns, Name: n}, obj)
		if apierrors.IsNotFound(err) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	}
	if !get(name, o.cluster) {
		t.Fatalf("no Cluster %s/%s", o.ns, name)
	}
	if !get(kubernetes.SecretName(name), o.secret) {
		t.Fatalf("no Secret for %s", name)
	}
	if p := (&apiv1.Pooler{}); get(kubernetes.PoolerName(name), p) {
		o.pooler = p
	}
	if sb := (&apiv1.ScheduledBackup{}); get(name+"-backup", sb) {
		o.sched = sb
	}
	return o
}

// completedBackup stores a Backup of cluster as CNPG leaves one that finished.
func completedBackup(t *testing.T, ctx context.Context, ns, cluster, name string, stopped time.Time) {
	t.Helper()
	completedBackupBy(t, ctx, ns, cluster, name, stopped, apiv1.BackupMethodPlugin)
}

func completedBackupBy(t *testing.T, ctx context.Context, ns, cluster, name string, stopped time.Time, method apiv1.BackupMethod) {
	t.Helper()
	b := &apiv1.Backup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"cnpg.io/cluster": cluster}},
		Spec:       apiv1.BackupSpec{Cluster: apiv1.LocalObjectReference{Name: cluster}, Method: method},
	}
	if err := shared.client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	completeBackup(t, ctx, b, stopped)
}

func completeBackup(t *testing.T, ctx context.Context, b *apiv1.Backup, stopped time.Time) {
	t.Helper()
	b.Status.Phase = apiv1.BackupPhaseCompleted
	b.Status.BackupID = b.Name + "-id"
	b.Status.StartedAt = &metav1.Time{Time: stopped.Add(-time.Minute)}
	b.Status.StoppedAt = &metav1.Time{Time: stopped}
	if err := shared.client.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// TestOperationsMakeCNPGObjects runs every API operation that reaches the
// runtime and checks the objects it leaves, each accepted by the real
// apiserver's validation of CNPG's CRDs (a rejected object fails Apply).
func TestOperationsMakeCNPGObjects(t *testing.T) {
	const store = "dbcloud-archive"
	prodHA := dbcloud.ServiceSpec{
		Size: dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8}, Environment: dbcloud.EnvProd, Replicas: 2, SyncReplicas: 1,
		Pooler: true, Running: true, Addons: []dbcloud.Addon{dbcloud.AddonTimeSeries, dbcloud.AddonAI},
	}
	dev := dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true}

	tests := []struct {
		name string
		spec dbcloud.ServiceSpec
		// op changes the service after its create; nil checks the create.
		op    func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service)
		check func(t *testing.T, o objects, svc *dbcloud.Service)
	}{
		{
			name: "create DEV shared", spec: dev,
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				s := o.cluster.Spec
				if s.Instances != 1 || s.PostgresConfiguration.Synchronous != nil || o.pooler != nil {
					t.Errorf("instances %d, synchronous %+v, pooler %v", s.Instances, s.PostgresConfiguration.Synchronous, o.pooler)
				}
				in := s.Bootstrap.InitDB
				if in == nil || in.Database != "tsdb" || in.Owner != "tsdbadmin" || in.Secret.Name != o.secret.Name {
					t.Errorf("bootstrap.initdb = %+v", in)
				}
				if got := s.Resources.Limits.Memory().Value(); got != 512<<20 {
					t.Errorf("memory limit %d", got)
				}
				if o.cluster.Annotations[kubernetes.HibernationAnnotation] != "off" {
					t.Errorf("hibernation annotation %q", o.cluster.Annotations[kubernetes.HibernationAnnotation])
				}
				if string(o.secret.Data["password"]) != svc.PasswordVerifier || string(o.secret.Data["username"]) != "tsdbadmin" {
					t.Errorf("secret holds %q", o.secret.Data)
				}
			},
		},
		{
			name: "create PROD HA with sync replica, pooler, addons and backups", spec: prodHA,
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				s := o.cluster.Spec
				if s.Instances != 3 {
					t.Errorf("instances %d, want 1 + 2 HA replicas", s.Instances)
				}
				if sy := s.PostgresConfiguration.Synchronous; sy == nil || sy.Method != apiv1.SynchronousReplicaConfigurationMethodAny || sy.Number != 1 {
					t.Errorf("synchronous %+v", sy)
				}
				if got := s.Resources.Requests.Cpu().MilliValue(); got != 2000 {
					t.Errorf("cpu request %dm", got)
				}
				if s.PostgresConfiguration.Parameters["shared_buffers"] != "2048MB" {
					t.Errorf("parameters %v", s.PostgresConfiguration.Parameters)
				}
				if libs := s.PostgresConfiguration.AdditionalLibraries; len(libs) != 1 || libs[0] != "timescaledb" {
					t.Errorf("shared_preload_libraries %v", libs)
				}
				if sql := strings.Join(s.Bootstrap.InitDB.PostInitApplicationSQL, ";"); !strings.Contains(sql, "timescaledb") || !strings.Contains(sql, "vector") {
					t.Errorf("postInitApplicationSQL %q", sql)
				}
				if s.PrimaryUpdateMethod != apiv1.PrimaryUpdateMethodSwitchover {
					t.Errorf("primaryUpdateMethod %q", s.PrimaryUpdateMethod)
				}
				// Not CNPG's 180 s: the primary's pod deleted would refuse
				// new connections that long (TestRuntime_HAFailover).
				if got := ptr.Deref(s.SmartShutdownTimeout, -1); got != 1 {
					t.Errorf("smartShutdownTimeout %d (-1: unset, CNPG's 180), want 1", got)
				}
				if len(s.Plugins) != 1 || s.Plugins[0].Name != kubernetes.BarmanPlugin || s.Plugins[0].Parameters["barmanObjectName"] != store {
					t.Errorf("plugins %+v", s.Plugins)
				}
				if o.pooler == nil || o.pooler.Spec.Type != apiv1.PoolerTypeRW || o.pooler.Spec.Cluster.Name != o.cluster.Name || *o.pooler.Spec.Instances != 2 {
					t.Errorf("pooler %+v", o.pooler)
				}
				if o.sched == nil || o.sched.Spec.Method != apiv1.BackupMethodPlugin || o.sched.Spec.Cluster.Name != o.cluster.Name {
					t.Errorf("scheduled backup %+v", o.sched)
				}
				for _, obj := range []client.Object{o.secret, o.pooler, o.sched} {
					if !ownedBy(obj, o.cluster) {
						t.Errorf("%T %s is not owned by the Cluster", obj, obj.GetName())
					}
				}
			},
		},
		{
			name: "stop", spec: prodHA,
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Running = false
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				if o.cluster.Annotations[kubernetes.HibernationAnnotation] != "on" {
					t.Errorf("hibernation annotation %q", o.cluster.Annotations[kubernetes.HibernationAnnotation])
				}
			},
		},
		{
			name: "start after stop", spec: func() dbcloud.ServiceSpec { s := dev; s.Running = false; return s }(),
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Running = true
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				if o.cluster.Annotations[kubernetes.HibernationAnnotation] != "off" {
					t.Errorf("hibernation annotation %q", o.cluster.Annotations[kubernetes.HibernationAnnotation])
				}
			},
		},
		{
			name: "resize", spec: prodHA,
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Size = dbcloud.Size{CPUMillis: 4000, MemoryGBs: 16}
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				s := o.cluster.Spec
				if s.Resources.Limits.Cpu().MilliValue() != 4000 || s.Resources.Limits.Memory().Value() != 16<<30 {
					t.Errorf("resources %v", s.Resources)
				}
				if s.PostgresConfiguration.Parameters["shared_buffers"] != "4096MB" {
					t.Errorf("shared_buffers %q", s.PostgresConfiguration.Parameters["shared_buffers"])
				}
				if s.Bootstrap.InitDB == nil {
					t.Error("a resize changed the bootstrap")
				}
			},
		},
		{
			name: "HA replicas and sync count change", spec: prodHA,
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Replicas, svc.Spec.SyncReplicas = 1, 0
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				if o.cluster.Spec.Instances != 2 || o.cluster.Spec.PostgresConfiguration.Synchronous != nil {
					t.Errorf("instances %d synchronous %+v", o.cluster.Spec.Instances, o.cluster.Spec.PostgresConfiguration.Synchronous)
				}
			},
		},
		{
			name: "pooler off", spec: prodHA,
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Pooler = false
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				if o.pooler != nil {
					t.Error("the Pooler is still there")
				}
			},
		},
		{
			name: "pooler on", spec: dev,
			op: func(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
				svc.Spec.Pooler = true
			},
			check: func(t *testing.T, o objects, svc *dbcloud.Service) {
				if o.pooler == nil || *o.pooler.Spec.Instances != 1 || o.pooler.Spec.PgBouncer.PoolMode != apiv1.PgBouncerPoolModeTransaction {
					t.Errorf("pooler %+v", o.pooler)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := newRuntime(t, kubernetes.Config{ObjectStore: store})
			ctx := testContext(t)
			svc := newService(tc.spec)
			if err := rt.Apply(ctx, svc); err != nil {
				t.Fatalf("create: %v", err)
			}
			if tc.op != nil {
				tc.op(t, ctx, rt, svc)
				svc.Generation++
				if err := rt.Apply(ctx, svc); err != nil {
					t.Fatalf("apply after the change: %v", err)
				}
			}
			tc.check(t, read(t, ctx, rt, svc), svc)
		})
	}
}

func ownedBy(obj client.Object, c *apiv1.Cluster) bool {
	for _, r := range obj.GetOwnerReferences() {
		if r.UID == c.UID && r.Kind == "Cluster" {
			return true
		}
	}
	return false
}

// TestForks checks the three fork strategies' Clusters: recovery from the
// newest Backup, from a fresh online Backup, and from the object store to
// a point in time.
func TestForks(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{ObjectStore: "dbcloud-archive"})
	ctx := testContext(t)
	parent := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, parent); err != nil {
		t.Fatal(err)
	}
	ns := rt.Namespace(parent.ProjectID)
	pc := kubernetes.ClusterName(parent)
	now := time.Now().UTC().Truncate(time.Second)
	completedBackup(t, ctx, ns, pc, pc+"-old", now.Add(-2*time.Hour))
	completedBackup(t, ctx, ns, pc, pc+"-new", now.Add(-time.Hour))

	fork := func(strategy dbcloud.ForkStrategy, target *time.Time) *dbcloud.Service {
		f := newService(parent.Spec)
		f.ProjectID = parent.ProjectID
		f.Fork = &dbcloud.ForkSource{ProjectID: parent.ProjectID, ServiceID: parent.ID, Strategy: strategy, TargetTime: target}
		return f
	}

	t.Run("recovery window", func(t *testing.T) {
		w, err := rt.RecoveryWindow(ctx, parent)
		if err != nil {
			t.Fatal(err)
		}
		if !w.LastSnapshot.Equal(now.Add(-time.Hour)) || !w.From.Equal(now.Add(-2*time.Hour)) || w.To.Before(now) || w.Stopped {
			t.Fatalf("window %+v", w)
		}
		none, err := rt.RecoveryWindow(ctx, newService(parent.Spec))
		if err != nil || !none.LastSnapshot.IsZero() {
			t.Fatalf("window of a service without backups %+v, %v", none, err)
		}
	})
	// A fork that takes a Backup of its parent waits for it; finish it as
	// CNPG would, and return it.
	// waitUntil polls cond until it holds, failing if the fork's Apply
	// (done) returns first.
	waitUntil := func(t *testing.T, done chan error, what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case err := <-done:
				t.Fatalf("Apply returned before %s: %v", what, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	applying := func(f *dbcloud.Service) chan error {
		done := make(chan error, 1)
		go func() { done <- rt.Apply(ctx, f) }()
		return done
	}
	// backedUp waits for the Backup a fork's Apply takes of its parent,
	// finishes it as CNPG would, and returns it once Apply did.
	backedUp := func(t *testing.T, done chan error, f *dbcloud.Service, suffix string) *apiv1.Backup {
		t.Helper()
		b := &apiv1.Backup{}
		key := types.NamespacedName{Namespace: ns, Name: kubernetes.ClusterName(f) + suffix}
		waitUntil(t, done, "its Backup existed", func() bool { return shared.client.Get(ctx, key, b) == nil })
		if b.Spec.Cluster.Name != pc || b.Spec.Online == nil || !*b.Spec.Online || b.Spec.Method != apiv1.BackupMethodPlugin {
			t.Fatalf("backup spec %+v", b.Spec)
		}
		completeBackup(t, ctx, b, time.Now())
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		return b
	}
	// With an object store every fork reads the parent's archive through
	// the plugin, as the plugin restores.
	fromArchive := func(t *testing.T, s apiv1.ClusterSpec) *apiv1.BootstrapRecovery {
		t.Helper()
		r := s.Bootstrap.Recovery
		if r == nil || r.Source != "origin" || r.Backup != nil || r.Owner != "tsdbadmin" || r.Database != "tsdb" || r.RecoveryTarget == nil {
			t.Fatalf("recovery %+v", r)
		}
		if len(s.ExternalClusters) != 1 || s.ExternalClusters[0].PluginConfiguration.Parameters["serverName"] != pc ||
			s.ExternalClusters[0].PluginConfiguration.Parameters["barmanObjectName"] != "dbcloud-archive" {
			t.Fatalf("external clusters %+v", s.ExternalClusters)
		}
		return r
	}
	// LAST_SNAPSHOT and NOW stop where their backup became consistent.
	asBackedUp := func(t *testing.T, r *apiv1.BootstrapRecovery, backup string) {
		t.Helper()
		if r.RecoveryTarget.BackupID != backup+"-id" || r.RecoveryTarget.TargetImmediate == nil || !*r.RecoveryTarget.TargetImmediate {
			t.Fatalf("recovery target %+v, want backup %s-id, immediate", r.RecoveryTarget, backup)
		}
	}
	t.Run("LAST_SNAPSHOT", func(t *testing.T) {
		f := fork(dbcloud.ForkLastSnapshot, nil)
		if err := rt.Apply(ctx, f); err != nil {
			t.Fatal(err)
		}
		asBackedUp(t, fromArchive(t, read(t, ctx, rt, f).cluster.Spec), pc+"-new")
	})
	t.Run("NOW", func(t *testing.T) {
		f := fork(dbcloud.ForkNow, nil)
		b := backedUp(t, applying(f), f, "-fork-source")
		asBackedUp(t, fromArchive(t, read(t, ctx, rt, f).cluster.Spec), b.Name)
	})
	t.Run("PITR", func(t *testing.T) {
		target := now.Add(-30 * time.Minute)
		f := fork(dbcloud.ForkPITR, &target)
		// The running parent first commits a marker, which CNPG does by
		// applying tsdbadmin's password again from a new version of its
		// Secret; only then does it take the backup that archives the WAL,
		// so the archive holds a commit after the target.
		done := applying(f)
		var secret corev1.Secret
		waitUntil(t, done, "the marker was asked for", func() bool {
			err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.SecretName(pc)}, &secret)
			return err == nil && strings.HasPrefix(secret.Annotations["dbcloud.io/commit-mark"], kubernetes.ClusterName(f)+" ")
		})
		select {
		case err := <-done:
			t.Fatalf("Apply returned before CNPG applied the marked Secret: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		early := &apiv1.Backup{}
		if shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.ClusterName(f) + "-fork-wal"}, early) == nil {
			t.Fatal("the backup was taken before the marker commit")
		}
		writeStatus(t, ctx, rt, parent, func(c *apiv1.Cluster) {
			c.Status.ManagedRolesStatus.PasswordStatus = map[string]apiv1.PasswordState{
				"tsdbadmin": {TransactionID: 900, SecretResourceVersion: secret.ResourceVersion},
			}
		})
		backedUp(t, done, f, "-fork-wal")
		r := fromArchive(t, read(t, ctx, rt, f).cluster.Spec)
		if r.RecoveryTarget.BackupID != "" || !strings.HasPrefix(r.RecoveryTarget.TargetTime, target.Format("2006-01-02 15:04:05")) {
			t.Fatalf("recovery target %+v", r.RecoveryTarget)
		}
	})
	t.Run("a plugin backup without its ID is not restored", func(t *testing.T) {
		p := newService(parent.Spec)
		if err := rt.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
		pns, pname := rt.Namespace(p.ProjectID), kubernetes.ClusterName(p)
		completedBackup(t, ctx, pns, pname, pname+"-noid", now)
		b := &apiv1.Backup{}
		if err := shared.client.Get(ctx, types.NamespacedName{Namespace: pns, Name: pname + "-noid"}, b); err != nil {
			t.Fatal(err)
		}
		b.Status.BackupID = ""
		if err := shared.client.Status().Update(ctx, b); err != nil {
			t.Fatal(err)
		}
		f := newService(p.Spec)
		f.ProjectID = p.ProjectID
		f.Fork = &dbcloud.ForkSource{ProjectID: p.ProjectID, ServiceID: p.ID, Strategy: dbcloud.ForkLastSnapshot}
		err := rt.Apply(ctx, f)
		if err == nil || dbcloud.IsTerminal(err) {
			t.Fatalf("fork from a backup without its ID: %v, want an error that is retried", err)
		}
	})
	t.Run("a volume snapshot is restored as it is", func(t *testing.T) {
		plain := newRuntime(t, kubernetes.Config{})
		p := newService(parent.Spec)
		if err := plain.Apply(ctx, p); err != nil {
			t.Fatal(err)
		}
		pns, pname := plain.Namespace(p.ProjectID), kubernetes.ClusterName(p)
		completedBackupBy(t, ctx, pns, pname, pname+"-snap", now, apiv1.BackupMethodVolumeSnapshot)
		f := newService(p.Spec)
		f.ProjectID = p.ProjectID
		f.Fork = &dbcloud.ForkSource{ProjectID: p.ProjectID, ServiceID: p.ID, Strategy: dbcloud.ForkLastSnapshot}
		if err := plain.Apply(ctx, f); err != nil {
			t.Fatal(err)
		}
		s := read(t, ctx, plain, f).cluster.Spec
		if r := s.Bootstrap.Recovery; r == nil || r.Backup == nil || r.Backup.Name != pname+"-snap" || r.Source != "" || len(s.ExternalClusters) != 0 {
			t.Fatalf("recovery %+v, external %+v: want the snapshot's Backup object", r, s.ExternalClusters)
		}
	})
	t.Run("PITR without an object store is refused", func(t *testing.T) {
		plain := newRuntime(t, kubernetes.Config{})
		target := now
		err := plain.Apply(ctx, fork(dbcloud.ForkPITR, &target))
		if !dbcloud.IsTerminal(err) || !dbcloud.IsConflict(err) {
			t.Fatalf("err = %v, want a terminal conflict", err)
		}
	})
}

// TestReplicaSet checks a read replica set's replica Cluster and Pooler,
// a resize, and its deletion.
func TestReplicaSet(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	parent := newService(dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvProd, Running: true})
	if err := rt.Apply(ctx, parent); err != nil {
		t.Fatal(err)
	}
	set := &dbcloud.ReadReplicaSet{ID: dbcloud.NewID(), ProjectID: parent.ProjectID, ServiceID: parent.ID, Name: "reads",
		Spec: dbcloud.ReadReplicaSetSpec{Size: dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4}, Nodes: 2, Environment: dbcloud.EnvProd, Pooler: true}}
	if err := rt.ApplyReplicaSet(ctx, parent, set); err != nil {
		t.Fatal(err)
	}
	ns := rt.Namespace(parent.ProjectID)
	var c apiv1.Cluster
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.ReplicaClusterName(set)}, &c); err != nil {
		t.Fatal(err)
	}
	s := c.Spec
	if s.Instances != 2 || s.ReplicaCluster == nil || !*s.ReplicaCluster.Enabled || s.ReplicaCluster.Source != "origin" {
		t.Fatalf("replica cluster spec %+v", s.ReplicaCluster)
	}
	if host := s.ExternalClusters[0].ConnectionParameters["host"]; host != kubernetes.ClusterName(parent)+"-rw."+ns+".svc" {
		t.Fatalf("source host %q", host)
	}
	if s.Bootstrap.PgBaseBackup == nil || s.Resources.Limits.Memory().Value() != 4<<30 {
		t.Fatalf("bootstrap %+v resources %v", s.Bootstrap, s.Resources)
	}
	var p apiv1.Pooler
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.PoolerName(c.Name)}, &p); err != nil || p.Spec.Type != "r" {
		t.Fatalf("pooler %+v: %v", p.Spec, err)
	}

	set.Spec.Size, set.Spec.Nodes = dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8}, 3
	if err := rt.ApplyReplicaSet(ctx, parent, set); err != nil {
		t.Fatal(err)
	}
	if err := shared.client.Get(ctx, client.ObjectKeyFromObject(&c), &c); err != nil || c.Spec.Instances != 3 || c.Spec.Resources.Limits.Cpu().MilliValue() != 2000 {
		t.Fatalf("after resize: %d instances, %v: %v", c.Spec.Instances, c.Spec.Resources, err)
	}

	if err := rt.DeleteReplicaSet(ctx, parent, set); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{&c, &p} {
		if err := shared.client.Get(ctx, client.ObjectKeyFromObject(obj), obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after delete: %v", obj, obj.GetName(), err)
		}
	}
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.ClusterName(parent)}, &c); err != nil {
		t.Errorf("deleting the set touched the parent: %v", err)
	}
}

// TestDeleteServiceDeletesEverything deletes a service with every kind of
// object and a replica set, and finds none left.
func TestDeleteServiceDeletesEverything(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{ObjectStore: "dbcloud-archive"})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvProd, Pooler: true, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	set := &dbcloud.ReadReplicaSet{ID: dbcloud.NewID(), ProjectID: svc.ProjectID, ServiceID: svc.ID,
		Spec: dbcloud.ReadReplicaSetSpec{Size: dbcloud.DefaultSize, Nodes: 1, Environment: dbcloud.EnvProd, Pooler: true}}
	if err := rt.ApplyReplicaSet(ctx, svc, set); err != nil {
		t.Fatal(err)
	}
	other := newService(svc.Spec)
	other.ProjectID = svc.ProjectID
	if err := rt.Apply(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteService(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteService(ctx, svc); err != nil {
		t.Fatalf("a second delete (the engine retries): %v", err)
	}
	ns := rt.Namespace(svc.ProjectID)
	for _, list := range []client.ObjectList{&apiv1.ClusterList{}, &apiv1.PoolerList{}, &apiv1.ScheduledBackupList{}, &apiv1.BackupList{}, &corev1.SecretList{}} {
		if err := shared.client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{kubernetes.LabelService: svc.ID}); err != nil {
			t.Fatal(err)
		}
		if items := meta.LenList(list); items != 0 {
			t.Errorf("%T: %d left", list, items)
		}
	}
	var c apiv1.Cluster
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: kubernetes.ClusterName(other)}, &c); err != nil {
		t.Errorf("another service of the project went too: %v", err)
	}
}

// TestCRDValidationIsEnforced guards the tests above: the apiserver does
// check CNPG's schema, so an object the runtime wrote was accepted by it.
func TestCRDValidationIsEnforced(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	bad := &apiv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "zero", Namespace: rt.Namespace(svc.ProjectID)}, Spec: apiv1.ClusterSpec{Instances: 0}}
	if err := shared.client.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("a Cluster with 0 instances: %v, want rejected by the CRD schema", err)
	}
	p := &apiv1.Pooler{ObjectMeta: metav1.ObjectMeta{Name: "bad-type", Namespace: rt.Namespace(svc.ProjectID)},
		Spec: apiv1.PoolerSpec{Cluster: apiv1.LocalObjectReference{Name: kubernetes.ClusterName(svc)}, Type: "rwx", PgBouncer: &apiv1.PgBouncerSpec{}}}
	if err := shared.client.Create(ctx, p); !apierrors.IsInvalid(err) {
		t.Fatalf("a Pooler of type rwx: %v, want rejected", err)
	}
}
