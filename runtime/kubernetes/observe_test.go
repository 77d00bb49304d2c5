package kubernetes_test

import (
	"strings"
	"testing"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"dbcloud/runtime/kubernetes"
)

// TestObserve maps CNPG's phases (api/v1 cluster_types.go) without an
// apiserver: only a healthy cluster with every instance ready and the
// primary where CNPG wants it counts as running.
func TestObserve(t *testing.T) {
	cluster := func(phase string, set func(c *apiv1.Cluster)) *apiv1.Cluster {
		c := &apiv1.Cluster{Spec: apiv1.ClusterSpec{Instances: 2}}
		c.Status.Phase = phase
		c.Status.Instances, c.Status.ReadyInstances = 2, 2
		c.Status.CurrentPrimary, c.Status.TargetPrimary = "c-1", "c-1"
		c.Status.InstancesStatus = map[apiv1.PodStatus][]string{apiv1.PodHealthy: {"c-1", "c-2"}}
		if set != nil {
			set(c)
		}
		return c
	}
	tests := []struct {
		name    string
		c       *apiv1.Cluster
		failed  string
		running bool
		reason  string
	}{
		{name: "healthy", c: cluster(apiv1.PhaseHealthy, nil), running: true},
		{name: "switchover", c: cluster(apiv1.PhaseSwitchover, func(c *apiv1.Cluster) { c.Status.TargetPrimary = "c-2" }),
			reason: "moving from c-1 to c-2 (Switchover in progress)"},
		{name: "rolling update", c: cluster(apiv1.PhaseUpgrade, nil), reason: apiv1.PhaseUpgrade},
		{name: "waiting for instances", c: cluster(apiv1.PhaseWaitingForInstancesToBeActive, nil), reason: apiv1.PhaseWaitingForInstancesToBeActive},
		{name: "objects cannot be made", c: cluster(apiv1.PhaseCannotCreateClusterObjects, func(c *apiv1.Cluster) {
			c.Status.PhaseReason = "secrets \"x\" not found"
		}), reason: "cannot run the service: Unable to create required cluster objects. secrets"},
		{name: "plugin failure", c: cluster(apiv1.PhaseFailurePlugin, nil), reason: "cannot run the service"},
		{name: "no status yet", c: &apiv1.Cluster{Spec: apiv1.ClusterSpec{Instances: 1}}, reason: "being set up"},
		{name: "healthy phase but a pod failed", c: cluster(apiv1.PhaseHealthy, func(c *apiv1.Cluster) {
			c.Status.InstancesStatus = map[apiv1.PodStatus][]string{apiv1.PodHealthy: {"c-1"}, apiv1.PodFailed: {"c-2"}}
		}), reason: "of 2 instances are ready"},
		{name: "hibernated", c: cluster(apiv1.PhaseHealthy, func(c *apiv1.Cluster) {
			c.Annotations = map[string]string{kubernetes.HibernationAnnotation: "on"}
			c.Status.Conditions = []metav1.Condition{{Type: "cnpg.io/hibernation", Status: metav1.ConditionTrue, Reason: "Hibernated"}}
		}), reason: "stopped"},
		{name: "failed bootstrap wins", c: cluster(apiv1.PhaseFirstPrimary, nil), failed: "job c-1-initdb failed", reason: "could not be made: job c-1-initdb failed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			obs := kubernetes.Observe(tc.c, tc.failed)
			if obs.Running != tc.running || !strings.Contains(obs.Reason, tc.reason) {
				t.Fatalf("running=%v reason=%q, want running=%v reason containing %q", obs.Running, obs.Reason, tc.running, tc.reason)
			}
		})
	}
}
