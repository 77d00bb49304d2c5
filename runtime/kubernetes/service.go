package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"dbcloud"
)

// EnsureService writes the service's objects and waits until CNPG reports
// them made (or ctx ends, and the engine calls again).
func (rt *Runtime) EnsureService(ctx context.Context, svc *dbcloud.Service) (*dbcloud.Observation, error) {
	if err := rt.Apply(ctx, svc); err != nil {
		return nil, err
	}
	return rt.waitBounded(ctx, func(ctx context.Context) (*dbcloud.Observation, bool, error) {
		obs, err := rt.CheckService(ctx, svc, false)
		if err != nil {
			return nil, false, err
		}
		// A stopped service is done once CNPG reports it hibernated.
		return obs, obs.Running == svc.Spec.Running && (svc.Spec.Running || obs.Reason == reasonHibernated), nil
	})
}

// waitBounded waits for CNPG at most Config.WaitTimeout: a cluster that
// never gets there (no storage class, an image that cannot be pulled) fails
// the attempt with CNPG's last word as the reason, and the engine retries
// or gives up as with any other failure, instead of holding its lease.
func (rt *Runtime) waitBounded(ctx context.Context, check func(context.Context) (*dbcloud.Observation, bool, error)) (*dbcloud.Observation, error) {
	wctx, cancel := context.WithTimeout(ctx, rt.cfg.WaitTimeout)
	defer cancel()
	var last *dbcloud.Observation
	obs, err := rt.wait(wctx, func() (*dbcloud.Observation, bool, error) {
		// Calls use ctx: only the waiting is bounded, not a request in flight.
		obs, done, err := check(ctx)
		if obs != nil {
			last = obs
		}
		return obs, done, err
	})
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		reason := "no status"
		if last != nil {
			reason = last.Reason
		}
		return nil, dbcloud.Errorf(dbcloud.KindUnavailable, "CloudNativePG has not made the change after %s: %s", rt.cfg.WaitTimeout, reason)
	}
	return obs, err
}

// wait polls check every PollInterval until it says done.
func (rt *Runtime) wait(ctx context.Context, check func() (*dbcloud.Observation, bool, error)) (*dbcloud.Observation, error) {
	return rt.waitEvery(ctx, rt.cfg.PollInterval, check)
}

// waitEvery polls check every interval until it says done.
func (rt *Runtime) waitEvery(ctx context.Context, interval time.Duration, check func() (*dbcloud.Observation, bool, error)) (*dbcloud.Observation, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		obs, done, err := check()
		if err != nil || done {
			return obs, err
		}
		select {
		case <-ctx.Done():
			reason := ""
			if obs != nil {
				reason = obs.Reason
			}
			return nil, fmt.Errorf("waiting for CloudNativePG (%s): %w", reason, ctx.Err())
		case <-t.C:
		}
	}
}

// Apply writes every object of the service without waiting for CNPG: the
// namespace, the password Secret, the Cluster, its Pooler and backups.
func (rt *Runtime) Apply(ctx context.Context, svc *dbcloud.Service) error {
	if !validVerifier(svc.PasswordVerifier) {
		return dbcloud.Terminal(errors.New("the service's password is not a SCRAM-SHA-256 verifier"))
	}
	ns := rt.Namespace(svc.ProjectID)
	name := ClusterName(svc)
	if err := rt.ensureNamespace(ctx, ns, svc.ProjectID); err != nil {
		return err
	}
	if err := rt.ensureObjectStore(ctx, ns); err != nil {
		return err
	}
	secret := secretFor(ns, name, svc.PasswordVerifier, serviceLabels(svc))
	if err := rt.upsertSecret(ctx, secret); err != nil {
		return err
	}
	cluster := &apiv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	exists, err := rt.exists(ctx, cluster)
	if err != nil {
		return err
	}
	var bootstrap *apiv1.BootstrapConfiguration
	var external []apiv1.ExternalCluster
	if !exists {
		if bootstrap, external, err = rt.bootstrapFor(ctx, svc); err != nil {
			return err
		}
	}
	if err := rt.upsert(ctx, cluster, func() error {
		rt.setClusterSpec(cluster, svc, bootstrap)
		if external != nil {
			cluster.Spec.ExternalClusters = external
		}
		return nil
	}); err != nil {
		return err
	}
	// What the service made goes with its Cluster.
	if err := rt.own(ctx, cluster, secret); err != nil {
		return err
	}
	if err := rt.ownObjectStore(ctx, cluster); err != nil {
		return err
	}
	if err := rt.ensurePooler(ctx, cluster, svc.Spec.Pooler, apiv1.PoolerTypeRW, svc.Spec.Environment, serviceLabels(svc)); err != nil {
		return err
	}
	main, pooler := serviceExposures(svc)
	if err := rt.ensureExposed(ctx, cluster, main, true, serviceLabels(svc)); err != nil {
		return err
	}
	if err := rt.ensureExposed(ctx, cluster, pooler, svc.Spec.Pooler, serviceLabels(svc)); err != nil {
		return err
	}
	return rt.ensureScheduledBackup(ctx, cluster, serviceLabels(svc))
}

// bootstrapFor is how a new service's data is made: initdb, or a fork's recovery.
func (rt *Runtime) bootstrapFor(ctx context.Context, svc *dbcloud.Service) (*apiv1.BootstrapConfiguration, []apiv1.ExternalCluster, error) {
	name := ClusterName(svc)
	if svc.Fork == nil {
		return initdbBootstrap(name), nil, nil
	}
	ns := rt.Namespace(svc.ProjectID)
	parent := ClusterName(&dbcloud.Service{ID: svc.Fork.ServiceID})
	var backup *apiv1.Backup
	var err error
	switch svc.Fork.Strategy {
	case dbcloud.ForkPITR:
		if rt.cfg.ObjectStore == "" || svc.Fork.TargetTime == nil {
			return nil, nil, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict,
				"Point-in-time forks need an object store for WAL; this %s runtime has none configured.", Name))
		}
		if err := rt.archivePastNow(ctx, ns, parent, name, serviceLabels(svc)); err != nil {
			return nil, nil, err
		}
		t := metav1.NewTime(*svc.Fork.TargetTime)
		return recoveryBootstrap(name, recoveryFrom{targetTime: &t}), []apiv1.ExternalCluster{rt.objectStoreSource(parent)}, nil
	case dbcloud.ForkNow:
		backup, err = rt.freshBackup(ctx, ns, parent, nowBackupName(name), serviceLabels(svc))
	default:
		backup, err = rt.newestBackup(ctx, ns, parent)
		if err == nil && backup == nil {
			err = dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "Service %s has no completed backup yet.", svc.Fork.ServiceID))
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if backup.Spec.Method != apiv1.BackupMethodPlugin {
		return recoveryBootstrap(name, recoveryFrom{backup: backup.Name}), nil, nil
	}
	if backup.Status.BackupID == "" {
		// Without it barman would restore its newest backup, which may not
		// be this one: retried until the plugin reports it.
		return nil, nil, fmt.Errorf("backup %s of %s has no backup ID yet", backup.Name, parent)
	}
	return recoveryBootstrap(name, recoveryFrom{backupID: backup.Status.BackupID}), []apiv1.ExternalCluster{rt.objectStoreSource(parent)}, nil
}

// archivePastNow makes the archive of a running parent reach past any
// target a PITR fork may ask of it now. Recovery to a time stops before
// the first transaction that ended after it, and fails (PostgreSQL 13 and
// later) when the archive holds none: every fork of an idle parent to a
// recent time would. So the parent first commits a transaction (markCommit),
// then takes a backup, whose end switches and archives the WAL (a segment
// is archived when full, or after archive_timeout, 5 min under CNPG).
// A hibernated or deleted parent takes neither: what it can be forked to
// is what it archived before it stopped.
func (rt *Runtime) archivePastNow(ctx context.Context, ns, parent, fork string, labels map[string]string) error {
	var c apiv1.Cluster
	err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: parent}, &c)
	if apierrors.IsNotFound(err) || err == nil && c.Annotations[HibernationAnnotation] == hibernationOn {
		return nil
	}
	if err != nil {
		return err
	}
	if err := rt.markCommit(ctx, ns, parent, fork); err != nil {
		return err
	}
	_, err = rt.freshBackup(ctx, ns, parent, pitrBackupName(fork), labels)
	return err
}

// markCommit makes the cluster commit a transaction now. dbcloud holds no
// superuser login into a Cluster, and needs none: a new version of
// tsdbadmin's password Secret (the same verifier, an annotation naming the
// fork and the time, so that every attempt makes a new version) makes CNPG
// apply the managed role's password again, an ALTER ROLE that commits.
func (rt *Runtime) markCommit(ctx context.Context, ns, cluster, fork string) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: SecretName(cluster), Namespace: ns}}
	if err := rt.upsert(ctx, secret, func() error {
		if secret.CreationTimestamp.IsZero() {
			return fmt.Errorf("no password Secret of %s to mark a commit with", cluster)
		}
		if secret.Annotations == nil {
			secret.Annotations = map[string]string{}
		}
		secret.Annotations[commitMarkAnnotation] = fork + " " + time.Now().UTC().Format(time.RFC3339Nano)
		return nil
	}); err != nil {
		return err
	}
	_, err := rt.waitBounded(ctx, rt.passwordApplied(ns, cluster))
	return err
}

// completedBackups are the cluster's completed Backups, oldest first.
// They are matched by spec.cluster, not by label: Backups made by hand count.
func (rt *Runtime) completedBackups(ctx context.Context, ns, cluster string) ([]apiv1.Backup, error) {
	var list apiv1.BackupList
	if err := rt.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []apiv1.Backup
	for _, b := range list.Items {
		if b.Spec.Cluster.Name == cluster && b.Status.Phase == apiv1.BackupPhaseCompleted && b.Status.StoppedAt != nil {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b apiv1.Backup) int { return a.Status.StoppedAt.Compare(b.Status.StoppedAt.Time) })
	return out, nil
}

// newestBackup is the cluster's newest completed Backup, nil when none.
func (rt *Runtime) newestBackup(ctx context.Context, ns, cluster string) (*apiv1.Backup, error) {
	list, err := rt.completedBackups(ctx, ns, cluster)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return &list[len(list)-1], nil
}

// RecoveryWindow is what a fork can restore: the newest completed Backup,
// and with an object store (continuous WAL archive) every time since the
// oldest one. A hibernated cluster's window ends when it was hibernated.
func (rt *Runtime) RecoveryWindow(ctx context.Context, svc *dbcloud.Service) (dbcloud.RecoveryWindow, error) {
	var w dbcloud.RecoveryWindow
	ns := rt.Namespace(svc.ProjectID)
	list, err := rt.completedBackups(ctx, ns, ClusterName(svc))
	if err != nil || len(list) == 0 {
		return w, err
	}
	w.LastSnapshot = list[len(list)-1].Status.StoppedAt.Time
	if rt.cfg.ObjectStore == "" {
		return w, nil
	}
	w.From, w.To = list[0].Status.StoppedAt.Time, time.Now()
	var c apiv1.Cluster
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ClusterName(svc)}, &c); err != nil {
		return w, client.IgnoreNotFound(err)
	}
	if h := meta.FindStatusCondition(c.Status.Conditions, hibernationCondition); h != nil && h.Status == metav1.ConditionTrue {
		w.Stopped, w.To = true, h.LastTransitionTime.Time
	}
	return w, nil
}

// freshBackup takes an online Backup of the parent (through the plugin
// when there is an object store, else a volume snapshot) and waits for it.
func (rt *Runtime) freshBackup(ctx context.Context, ns, cluster, name string, labels map[string]string) (*apiv1.Backup, error) {
	b := &apiv1.Backup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if err := rt.upsert(ctx, b, func() error {
		b.Labels = mergeLabels(b.Labels, labels)
		b.Labels[clusterLabel] = cluster
		if b.CreationTimestamp.IsZero() {
			b.Spec = apiv1.BackupSpec{Cluster: apiv1.LocalObjectReference{Name: cluster}, Online: ptr.To(true),
				Method: apiv1.BackupMethodVolumeSnapshot}
			if rt.cfg.ObjectStore != "" {
				b.Spec.Method = apiv1.BackupMethodPlugin
				b.Spec.PluginConfiguration = &apiv1.BackupPluginConfiguration{Name: BarmanPlugin}
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	_, err := rt.waitBounded(ctx, func(ctx context.Context) (*dbcloud.Observation, bool, error) {
		if err := rt.c.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return nil, false, err
		}
		switch b.Status.Phase {
		case apiv1.BackupPhaseCompleted:
			return nil, true, nil
		case apiv1.BackupPhaseFailed:
			return nil, false, dbcloud.Terminal(fmt.Errorf("backup %s of %s failed: %s", name, cluster, b.Status.Error))
		}
		return &dbcloud.Observation{Reason: "Taking a backup of the parent for the fork."}, false, nil
	})
	return b, err
}

// ensurePooler makes or removes the cluster's Pooler.
func (rt *Runtime) ensurePooler(ctx context.Context, cluster *apiv1.Cluster, want bool, typ apiv1.PoolerType, env dbcloud.Environment, labels map[string]string) error {
	p := &apiv1.Pooler{ObjectMeta: metav1.ObjectMeta{Name: PoolerName(cluster.Name), Namespace: cluster.Namespace}}
	if !want {
		return client.IgnoreNotFound(rt.c.Delete(ctx, p))
	}
	return rt.upsert(ctx, p, func() error {
		p.Labels = mergeLabels(p.Labels, labels)
		p.Spec = poolerSpec(cluster.Name, typ, env)
		return controllerutil.SetControllerReference(cluster, p, rt.c.Scheme())
	})
}

// ensureScheduledBackup schedules backups through the plugin when there is
// an object store to keep them.
func (rt *Runtime) ensureScheduledBackup(ctx context.Context, cluster *apiv1.Cluster, labels map[string]string) error {
	if rt.cfg.ObjectStore == "" {
		return nil
	}
	sb := &apiv1.ScheduledBackup{ObjectMeta: metav1.ObjectMeta{Name: cluster.Name + "-backup", Namespace: cluster.Namespace}}
	return rt.upsert(ctx, sb, func() error {
		sb.Labels = mergeLabels(sb.Labels, labels)
		sb.Spec = apiv1.ScheduledBackupSpec{
			Schedule: rt.cfg.BackupSchedule, Cluster: apiv1.LocalObjectReference{Name: cluster.Name},
			Immediate: ptr.To(true), Method: apiv1.BackupMethodPlugin, BackupOwnerReference: "cluster",
			PluginConfiguration: &apiv1.BackupPluginConfiguration{Name: BarmanPlugin},
		}
		return controllerutil.SetControllerReference(cluster, sb, rt.c.Scheme())
	})
}

// CheckService maps the Cluster's status; it changes nothing.
func (rt *Runtime) CheckService(ctx context.Context, svc *dbcloud.Service, measure bool) (*dbcloud.Observation, error) {
	ns := rt.Namespace(svc.ProjectID)
	var c apiv1.Cluster
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ClusterName(svc)}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return &dbcloud.Observation{Reason: "The service's Cluster does not exist."}, nil
		}
		return nil, err
	}
	failed, err := rt.failedBootstrap(ctx, &c)
	if err != nil {
		return nil, err
	}
	obs := Observe(&c, failed)
	if err := rt.observeRollout(ctx, obs, &c); err != nil {
		return nil, err
	}
	main, pooler := serviceExposures(svc)
	var pe *exposure
	if svc.Spec.Pooler {
		pe = &pooler
	}
	if err := rt.observeEndpoints(ctx, obs, ns, main, pe); err != nil {
		return nil, err
	}
	if measure && obs.Running {
		obs.Metrics = rt.measure(ctx, ns, obs)
	}
	if failed != "" {
		return obs, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "%s", obs.Reason))
	}
	return obs, nil
}

// serviceExposures are what a service exposes: its primary on the port
// claimed at creation, its pooler on the one claimed when it was enabled.
func serviceExposures(svc *dbcloud.Service) (main, pooler exposure) {
	return exposures(ClusterName(svc), svc.Endpoint, svc.PoolerPort, primaryExposure)
}

// exposures are a Cluster's main exposure (made by mainOf: the primary,
// or all instances) and its pooler's, on the endpoint's host and ports.
func exposures(cluster string, ep *dbcloud.Endpoint, poolerPort int, mainOf func(cluster string, port int) exposure) (main, pooler exposure) {
	var host string
	var port int
	if ep != nil {
		host, port = ep.Host, ep.Port
	}
	main = mainOf(cluster, port)
	main.host = host
	pooler = poolerExposure(PoolerName(cluster), poolerPort)
	pooler.host = host
	return main, pooler
}

// DeleteService deletes the service's Cluster and, by label, everything
// else it made: owner references would have the garbage collector do the
// same, and this does not depend on it.
func (rt *Runtime) DeleteService(ctx context.Context, svc *dbcloud.Service) error {
	return rt.deleteLabelled(ctx, rt.Namespace(svc.ProjectID), client.MatchingLabels{LabelService: svc.ID})
}

func (rt *Runtime) deleteLabelled(ctx context.Context, ns string, sel client.MatchingLabels) error {
	for _, list := range ownedLists() {
		if err := rt.c.List(ctx, list, client.InNamespace(ns), sel); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		items, err := metaItems(list)
		if err != nil {
			return err
		}
		for _, o := range items {
			if err := rt.c.Delete(ctx, o, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}

// PasswordTimeout bounds an updatePassword on this runtime
// (PasswordBudget). A new password reaches PostgreSQL in
// three hops: the operator sees the Secret change and records its version
// in the Cluster's status, the instance manager sees that and runs its
// role synchronizer, which reports back in the status. Each hop is a
// controller's queue, shared with every other Cluster it reconciles: 4-8 s
// when quiet, past the local runtime's 10 s while the operator works
// through other Clusters' rollouts and backups. It stays under 30 s, the
// original CLI's whole-request timeout: a client that gave up would not
// be told whether its password changed.
const PasswordTimeout = 25 * time.Second

// PasswordBudget is PasswordTimeout (dbcloud.PasswordBudgeter).
func (rt *Runtime) PasswordBudget() time.Duration { return PasswordTimeout }

// SetPassword writes the verifier into the Secret and waits until CNPG
// reports the role's password applied from that version of the Secret
// (status.managedRolesStatus.passwordStatus), so the 204 follows the change.
func (rt *Runtime) SetPassword(ctx context.Context, svc *dbcloud.Service, verifier string) error {
	if !validVerifier(verifier) {
		return errors.New("not a SCRAM-SHA-256 verifier")
	}
	ns := rt.Namespace(svc.ProjectID)
	name := ClusterName(svc)
	secret := secretFor(ns, name, verifier, serviceLabels(svc))
	began := time.Now()
	if err := rt.upsertSecret(ctx, secret); err != nil {
		return err
	}
	applied := rt.passwordApplied(ns, name)
	// A caller waits on this answer, so it is looked for more often than
	// a rollout: two reads a poll, for seconds.
	_, err := rt.waitEvery(ctx, min(rt.cfg.PollInterval, 250*time.Millisecond), func() (*dbcloud.Observation, bool, error) { return applied(ctx) })
	// How long CNPG takes is what PasswordTimeout is chosen by; the log
	// keeps it.
	if err != nil {
		rt.log.Warn("password not applied", "namespace", ns, "cluster", name, "seconds", time.Since(began).Seconds(), "error", err)
		return err
	}
	rt.log.Info("password applied", "namespace", ns, "cluster", name, "seconds", time.Since(began).Seconds())
	return nil
}

// passwordApplied checks that CNPG reports tsdbadmin's password applied
// from the Secret as it is now (status.managedRolesStatus.passwordStatus),
// so from every write to it made before the check. Not from one given
// version: two writes close together (a new password, a commit marker) may
// be applied as one, the later version only.
func (rt *Runtime) passwordApplied(ns, cluster string) func(context.Context) (*dbcloud.Observation, bool, error) {
	return func(ctx context.Context) (*dbcloud.Observation, bool, error) {
		var c apiv1.Cluster
		if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: cluster}, &c); err != nil {
			return nil, false, err
		}
		var secret corev1.Secret
		if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: SecretName(cluster)}, &secret); err != nil {
			return nil, false, err
		}
		st, ok := c.Status.ManagedRolesStatus.PasswordStatus[owner]
		return &dbcloud.Observation{Reason: "CloudNativePG has not applied tsdbadmin's password Secret yet."},
			ok && st.SecretResourceVersion == secret.ResourceVersion, nil
	}
}

func (rt *Runtime) ensureNamespace(ctx context.Context, ns, projectID string) error {
	n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	return rt.upsert(ctx, n, func() error {
		n.Labels = mergeLabels(n.Labels, map[string]string{LabelManagedBy: managedBy, LabelProject: projectID})
		return nil
	})
}

// upsertSecret writes the Secret's data; ResourceVersion is then the written one.
func (rt *Runtime) upsertSecret(ctx context.Context, s *corev1.Secret) error {
	want := s.Data
	labels := s.Labels
	return rt.upsert(ctx, s, func() error {
		s.Labels = mergeLabels(s.Labels, labels)
		s.Type = corev1.SecretTypeBasicAuth
		s.Data = want
		return nil
	})
}

// upsert creates or updates obj with mutate, retrying on conflicts.
func (rt *Runtime) upsert(ctx context.Context, obj client.Object, mutate func() error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		_, err := controllerutil.CreateOrUpdate(ctx, rt.c, obj, mutate)
		return err
	})
}

func (rt *Runtime) exists(ctx context.Context, obj client.Object) (bool, error) {
	err := rt.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// own makes obj a dependent of the cluster, for the garbage collector.
func (rt *Runtime) own(ctx context.Context, cluster *apiv1.Cluster, obj client.Object) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := rt.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		if slices.ContainsFunc(obj.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == cluster.UID }) {
			return nil
		}
		if err := controllerutil.SetOwnerReference(cluster, obj, rt.c.Scheme()); err != nil {
			return err
		}
		return rt.c.Update(ctx, obj)
	})
}
