package kubernetes

import (
	"context"
	"fmt"
	"slices"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
)

// hibernationCondition is the condition CNPG sets while it hibernates a
// cluster: True with reason Hibernated once every pod is gone
// (pkg/reconciler/hibernation/status.go).
const (
	hibernationCondition = "cnpg.io/hibernation"
	hibernatedReason     = "Hibernated"
	reasonHibernated     = "The service is stopped (CloudNativePG hibernation)."
)

// bootstrapJob reports whether a jobRole label is one of the Jobs that
// make a cluster's first instance (CNPG's pkg/specs/jobs.go).
func bootstrapJob(role string) bool {
	switch role {
	case "initdb", "full-recovery", "snapshot-recovery", "pgbasebackup", "import":
		return true
	}
	return false
}

// Observe maps a Cluster's status to what dbcloud shows. failedBootstrap,
// when not empty, says why the Job making the first instance failed.
//
// Running needs all of: phase "Cluster in healthy state", every instance
// ready, and the current primary being the target primary (during a
// failover or switchover CNPG sets targetPrimary first and currentPrimary
// once the new primary is promoted).
func Observe(c *apiv1.Cluster, failedBootstrap string) *dbcloud.Observation {
	st := &c.Status
	obs := &dbcloud.Observation{Instances: instances(st)}
	hib := meta.FindStatusCondition(st.Conditions, hibernationCondition)
	switch {
	case failedBootstrap != "":
		obs.Reason = "The service's data could not be made: " + failedBootstrap
	case hib != nil && hib.Status == metav1.ConditionTrue && hib.Reason == hibernatedReason:
		obs.Instances = nil
		obs.Reason = reasonHibernated
	case c.Annotations[HibernationAnnotation] == hibernationOn:
		obs.Reason = "The service is being stopped (CloudNativePG hibernation)."
	case st.Phase == apiv1.PhaseUnrecoverable || st.Phase == apiv1.PhaseCannotCreateClusterObjects ||
		st.Phase == apiv1.PhaseFailurePlugin || st.Phase == apiv1.PhaseUnknownPlugin || st.Phase == apiv1.PhaseImageCatalogError:
		obs.Reason = fmt.Sprintf("CloudNativePG cannot run the service: %s. %s", st.Phase, st.PhaseReason)
	case st.CurrentPrimary != "" && st.TargetPrimary != "" && st.CurrentPrimary != st.TargetPrimary:
		obs.Reason = fmt.Sprintf("The primary is moving from %s to %s (%s).", st.CurrentPrimary, st.TargetPrimary, phaseOr(st.Phase, "failover"))
	case st.Phase != apiv1.PhaseHealthy:
		obs.Reason = fmt.Sprintf("CloudNativePG: %s.", phaseOr(st.Phase, "the cluster is being set up"))
	case st.ReadyInstances < c.Spec.Instances || len(st.InstancesStatus[apiv1.PodHealthy]) < c.Spec.Instances:
		obs.Reason = fmt.Sprintf("%d of %d instances are ready.", st.ReadyInstances, c.Spec.Instances)
	case st.CurrentPrimary == "":
		obs.Reason = "CloudNativePG reports no primary."
	default:
		obs.Running = true
	}
	return obs
}

func phaseOr(phase, def string) string {
	if phase == "" {
		return def
	}
	return phase
}

// instances lists the cluster's instances, the current primary first.
func instances(st *apiv1.ClusterStatus) []dbcloud.Instance {
	var out []dbcloud.Instance
	if st.CurrentPrimary != "" {
		out = append(out, dbcloud.Instance{ID: st.CurrentPrimary, Role: "primary"})
	}
	var others []string
	for _, names := range st.InstancesStatus {
		for _, n := range names {
			if n != st.CurrentPrimary && !slices.Contains(others, n) {
				others = append(others, n)
			}
		}
	}
	slices.Sort(others)
	for _, n := range others {
		out = append(out, dbcloud.Instance{ID: n, Role: "replica"})
	}
	return out
}

// failedBootstrap reports why the cluster's bootstrap Job failed, or "".
// CNPG keeps such a cluster in phase "Setting up primary"; the Job's Failed
// condition is where the failure shows.
func (rt *Runtime) failedBootstrap(ctx context.Context, c *apiv1.Cluster) (string, error) {
	if c.Status.CurrentPrimary != "" {
		return "", nil // a primary exists: bootstrap is behind us
	}
	var jobs batchv1.JobList
	if err := rt.c.List(ctx, &jobs, client.InNamespace(c.Namespace), client.MatchingLabels{clusterLabel: c.Name}); err != nil {
		return "", err
	}
	for _, j := range jobs.Items {
		if !bootstrapJob(j.Labels["cnpg.io/jobRole"]) {
			continue
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
				return fmt.Sprintf("job %s failed (%s: %s)", j.Name, cond.Reason, cond.Message), nil
			}
		}
	}
	return "", nil
}

// observeRollout makes a running observation not running while an
// instance's pod still has other resources than the Cluster asks for.
// CNPG publishes no observedGeneration for a Cluster, so right after a
// resize its previous healthy status reads as done: against real pods a
// resize answered READY 0.3 s after the request, before CNPG had replaced
// a single pod. The pods are CNPG's work in progress; with none at all
// (an apiserver without a kubelet, as in the tests that write CNPG's
// status by hand) there is nothing to compare.
func (rt *Runtime) observeRollout(ctx context.Context, obs *dbcloud.Observation, c *apiv1.Cluster) error {
	if !obs.Running {
		return nil
	}
	var pods corev1.PodList
	if err := rt.c.List(ctx, &pods, client.InNamespace(c.Namespace),
		client.MatchingLabels{clusterLabel: c.Name, "cnpg.io/podRole": "instance"}); err != nil {
		return err
	}
	for _, p := range pods.Items {
		for _, ct := range p.Spec.Containers {
			if ct.Name == "postgres" && !sameResources(ct.Resources, c.Spec.Resources) {
				obs.Running = false
				obs.Reason = fmt.Sprintf("CloudNativePG is applying the new resources (pod %s still has the previous ones).", p.Name)
				return nil
			}
		}
	}
	return nil
}

// sameResources reports whether a pod's resources have the CPU and memory
// requests and limits the Cluster asks for. Only what the Cluster sets is
// compared: a LimitRange may fill in what it leaves out.
func sameResources(pod, want corev1.ResourceRequirements) bool {
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		for _, pair := range [][2]corev1.ResourceList{{pod.Requests, want.Requests}, {pod.Limits, want.Limits}} {
			w, ok := pair[1][name]
			if !ok {
				continue
			}
			if p, ok := pair[0][name]; !ok || p.Cmp(w) != 0 {
				return false
			}
		}
	}
	return true
}
