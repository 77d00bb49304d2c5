package kubernetes

import (
	"context"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
)

// A read replica set is a replica Cluster (replica.enabled, replica.source)
// streaming from the parent's -rw Service: it has its own size and node
// count, which the parent's -ro Service could not give, and it follows the
// parent's primary across failovers because it connects through that
// Service. Its pooler is of type "r" (every instance of the replica
// Cluster): all of them are read-only standbys, and type "ro" would leave
// out the replica Cluster's designated primary, one of the set's nodes.
const replicaSetPoolerType = apiv1.PoolerType("r")

// EnsureReplicaSet writes the set's replica Cluster and Pooler and waits
// until CNPG reports them made.
func (rt *Runtime) EnsureReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	if err := rt.ApplyReplicaSet(ctx, parent, set); err != nil {
		return nil, err
	}
	return rt.waitBounded(ctx, func(ctx context.Context) (*dbcloud.Observation, bool, error) {
		obs, err := rt.CheckReplicaSet(ctx, parent, set)
		return obs, err == nil && obs.Running, err
	})
}

// ApplyReplicaSet writes the set's objects without waiting for CNPG.
func (rt *Runtime) ApplyReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	ns := rt.Namespace(parent.ProjectID)
	c := &apiv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: ReplicaClusterName(set), Namespace: ns}}
	if err := rt.upsert(ctx, c, func() error {
		c.Labels = mergeLabels(c.Labels, replicaSetLabels(set))
		s := &c.Spec
		s.Instances = set.Spec.Nodes
		// The set streams its parent's data: the parent's version.
		rt.setCommon(s, set.Spec.Size, parent.Spec.PGVersion)
		s.ReplicaCluster = &apiv1.ReplicaClusterConfiguration{Enabled: ptr.To(true), Source: originSource}
		s.ExternalClusters = []apiv1.ExternalCluster{streamingSource(ns, ClusterName(parent))}
		if s.Bootstrap == nil {
			s.Bootstrap = &apiv1.BootstrapConfiguration{PgBaseBackup: &apiv1.BootstrapPgBaseBackup{Source: originSource}}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := rt.ensurePooler(ctx, c, set.Spec.Pooler, replicaSetPoolerType, set.Spec.Environment, replicaSetLabels(set)); err != nil {
		return err
	}
	main, pooler := replicaSetExposures(set)
	if err := rt.ensureExposed(ctx, c, main, true, replicaSetLabels(set)); err != nil {
		return err
	}
	return rt.ensureExposed(ctx, c, pooler, set.Spec.Pooler, replicaSetLabels(set))
}

// replicaSetExposures are what a read replica set exposes: all its nodes,
// and its pooler, on the ports claimed for them.
func replicaSetExposures(set *dbcloud.ReadReplicaSet) (main, pooler exposure) {
	return exposures(ReplicaClusterName(set), set.Endpoint, set.PoolerPort, instancesExposure)
}

// CheckReplicaSet maps the replica Cluster's status.
func (rt *Runtime) CheckReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) (*dbcloud.Observation, error) {
	ns := rt.Namespace(parent.ProjectID)
	var c apiv1.Cluster
	if err := rt.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: ReplicaClusterName(set)}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return &dbcloud.Observation{Reason: "The replica set's Cluster does not exist."}, nil
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
	main, pooler := replicaSetExposures(set)
	var pe *exposure
	if set.Spec.Pooler {
		pe = &pooler
	}
	if err := rt.observeEndpoints(ctx, obs, ns, main, pe); err != nil {
		return nil, err
	}
	if failed != "" {
		return obs, dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindConflict, "%s", obs.Reason))
	}
	return obs, nil
}

// DeleteReplicaSet deletes the replica Cluster and its Pooler. CNPG drops
// nothing on the parent for it: a replica Cluster streams without a slot
// on the parent.
func (rt *Runtime) DeleteReplicaSet(ctx context.Context, parent *dbcloud.Service, set *dbcloud.ReadReplicaSet) error {
	return rt.deleteLabelled(ctx, rt.Namespace(parent.ProjectID), client.MatchingLabels{LabelReplicaSet: set.ID})
}
