package kubernetes_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"dbcloud"
	"dbcloud/internal/kubetest"
	"dbcloud/runtime/kubernetes"
)

// writeStatus sets the Cluster's status as CNPG's operator would (through
// the status subresource), with the values of its types and documentation:
// phase texts from api/v1 (cluster_types.go), instance names NAME-N, the
// hibernation condition of pkg/reconciler/hibernation.
func writeStatus(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service, set func(c *apiv1.Cluster)) {
	t.Helper()
	key := types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: kubernetes.ClusterName(svc)}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var c apiv1.Cluster
		if err := shared.client.Get(ctx, key, &c); err != nil {
			return err
		}
		set(&c)
		return shared.client.Status().Update(ctx, &c)
	}); err != nil {
		t.Fatal(err)
	}
}

func healthy(_ string, primary string, n int) func(c *apiv1.Cluster) {
	return func(c *apiv1.Cluster) { kubetest.Healthy(c, primary, n) }
}

func TestStatusMapping(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.DefaultSize, Environment: dbcloud.EnvProd, Replicas: 2, Pooler: true, Running: true})
	name := kubernetes.ClusterName(svc)

	// EnsureService waits for CNPG; the operator here is the test.
	done := make(chan error, 1)
	var obs *dbcloud.Observation
	go func() {
		var err error
		obs, err = rt.EnsureService(ctx, svc)
		done <- err
	}()
	waitCluster(t, ctx, rt, svc)
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
		c.Status.Phase = apiv1.PhaseFirstPrimary
		c.Status.Instances = 1
	})
	check := func(wantRunning bool, wantReason string) *dbcloud.Observation {
		t.Helper()
		o, err := rt.CheckService(ctx, svc, false)
		if err != nil {
			t.Fatal(err)
		}
		if o.Running != wantRunning || !strings.Contains(o.Reason, wantReason) {
			t.Fatalf("observation running=%v reason=%q, want running=%v reason containing %q", o.Running, o.Reason, wantRunning, wantReason)
		}
		return o
	}
	check(false, apiv1.PhaseFirstPrimary)
	select {
	case err := <-done:
		t.Fatalf("EnsureService returned while CNPG was setting up the primary: %v", err)
	default:
	}

	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 3))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !obs.Running || len(obs.Instances) != 3 || obs.Instances[0] != (dbcloud.Instance{ID: name + "-1", Role: "primary"}) || obs.PoolerEndpoint == nil {
		t.Fatalf("after healthy: %+v", obs)
	}

	t.Run("a replica not ready", func(t *testing.T) {
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			c.Status.ReadyInstances = 2
			c.Status.InstancesStatus = map[apiv1.PodStatus][]string{apiv1.PodHealthy: {name + "-1", name + "-2"}, apiv1.PodFailed: {name + "-3"}}
		})
		check(false, "2 of 3 instances are ready")
	})

	t.Run("failover moves the current primary", func(t *testing.T) {
		// CNPG first sets targetPrimary and the phase, then currentPrimary
		// once the new primary is promoted (docs/src/failover.md).
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			c.Status.Phase = apiv1.PhaseFailOver
			c.Status.TargetPrimary = name + "-2"
			c.Status.ReadyInstances = 2
		})
		check(false, "moving from "+name+"-1 to "+name+"-2")
		writeStatus(t, ctx, rt, svc, healthy(name, name+"-2", 3))
		o := check(true, "")
		if o.Instances[0] != (dbcloud.Instance{ID: name + "-2", Role: "primary"}) || o.Instances[1].ID != name+"-1" {
			t.Fatalf("instances after failover %+v", o.Instances)
		}
	})

	t.Run("unrecoverable", func(t *testing.T) {
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			c.Status.Phase = apiv1.PhaseUnrecoverable
			c.Status.PhaseReason = "No pods are active, the cluster needs manual intervention "
		})
		check(false, "No pods are active")
		writeStatus(t, ctx, rt, svc, healthy(name, name+"-2", 3))
	})

	t.Run("hibernation", func(t *testing.T) {
		svc.Spec.Running = false
		svc.Generation++
		done := make(chan error, 1)
		go func() {
			var err error
			obs, err = rt.EnsureService(ctx, svc)
			done <- err
		}()
		waitFor(t, ctx, func() bool {
			var c apiv1.Cluster
			err := shared.client.Get(ctx, types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: name}, &c)
			return err == nil && c.Annotations[kubernetes.HibernationAnnotation] == "on"
		})
		// While pods are deleted, the condition is False (DeletingPods).
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: "cnpg.io/hibernation", Status: metav1.ConditionFalse,
				Reason: "DeletingPods", Message: "Hibernation is in progress"})
		})
		check(false, "being stopped")
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: "cnpg.io/hibernation", Status: metav1.ConditionTrue,
				Reason: "Hibernated", Message: "Cluster has been hibernated"})
			c.Status.ReadyInstances, c.Status.InstancesStatus = 0, nil
		})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if obs.Running || len(obs.Instances) != 0 {
			t.Fatalf("hibernated: %+v", obs)
		}

		svc.Spec.Running = true
		svc.Generation++
		go func() {
			var err error
			obs, err = rt.EnsureService(ctx, svc)
			done <- err
		}()
		waitFor(t, ctx, func() bool {
			var c apiv1.Cluster
			err := shared.client.Get(ctx, types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: name}, &c)
			return err == nil && c.Annotations[kubernetes.HibernationAnnotation] == "off"
		})
		writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
			healthy(name, name+"-2", 3)(c)
			meta.RemoveStatusCondition(&c.Status.Conditions, "cnpg.io/hibernation")
		})
		if err := <-done; err != nil || !obs.Running {
			t.Fatalf("resumed: %+v, %v", obs, err)
		}
	})
}

// TestFailedBootstrap: CNPG leaves the Cluster in "Setting up primary" and
// the initdb Job failed; the runtime reports that as terminal, so the
// create fails with the reason instead of waiting forever.
func TestFailedBootstrap(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	name := kubernetes.ClusterName(svc)
	ns := rt.Namespace(svc.ProjectID)
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) { c.Status.Phase = apiv1.PhaseFirstPrimary })
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1-initdb", Namespace: ns,
			Labels: map[string]string{"cnpg.io/cluster": name, "cnpg.io/jobRole": "initdb", "cnpg.io/instanceName": name + "-1"}},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To(int32(0)), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "initdb", Image: "ghcr.io/cloudnative-pg/postgresql:17"}},
		}}},
	}
	if err := shared.client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	job.Status.StartTime = &metav1.Time{Time: now.Add(-time.Minute)}
	job.Status.Failed = 1
	job.Status.Conditions = []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit", LastTransitionTime: now},
	}
	if err := shared.client.Status().Update(ctx, job); err != nil {
		t.Fatal(err)
	}
	obs, err := rt.EnsureService(ctx, svc)
	if !dbcloud.IsTerminal(err) || !strings.Contains(err.Error(), "BackoffLimitExceeded") {
		t.Fatalf("EnsureService = %v, %v; want a terminal error naming the failed job", obs, err)
	}
}

// TestUpdatePassword: the verifier goes into the Secret, and SetPassword
// returns once CNPG reports the role's password applied from that version.
func TestUpdatePassword(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	name := kubernetes.ClusterName(svc)
	verifier := dbcloud.NewSCRAMVerifier("second-password")
	done := make(chan error, 1)
	go func() { done <- rt.SetPassword(ctx, svc, verifier) }()
	var secret corev1.Secret
	waitFor(t, ctx, func() bool {
		err := shared.client.Get(ctx, types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: kubernetes.SecretName(name)}, &secret)
		return err == nil && string(secret.Data["password"]) == verifier
	})
	if secret.Labels["cnpg.io/reload"] != "true" {
		t.Errorf("the password Secret lacks CNPG's reload label, so CNPG would not apply a change: %v", secret.Labels)
	}
	select {
	case err := <-done:
		t.Fatalf("SetPassword returned before CNPG applied the password: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Another write to the Secret (a PITR fork's commit marker) before
	// CNPG reconciles: CNPG applies both as one, the later version only,
	// and the new password is applied all the same.
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations["dbcloud.io/commit-mark"] = "a fork"
	if err := shared.client.Update(ctx, &secret); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
		c.Status.ManagedRolesStatus.PasswordStatus = map[string]apiv1.PasswordState{
			"tsdbadmin": {TransactionID: 812, SecretResourceVersion: secret.ResourceVersion},
		}
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := rt.SetPassword(ctx, svc, "plaintext"); err == nil {
		t.Fatal("a plaintext password was accepted into the Secret")
	}
}

// TestVPCUnsupported: the runtime offers no VPCs and says so.
func TestVPCUnsupported(t *testing.T) {
	ctx := context.Background()
	var n kubernetes.Network
	err := n.CreateVPC(ctx, &dbcloud.VPC{})
	var de *dbcloud.Error
	if !errors.As(err, &de) || de.Kind != dbcloud.KindConflict || de.Code != "UNSUPPORTED" || !strings.Contains(de.Message, "kubernetes runtime") {
		t.Fatalf("CreateVPC = %v", err)
	}
	if _, err := n.Attach(ctx, &dbcloud.VPC{}, &dbcloud.Service{}); !dbcloud.IsTerminal(err) {
		t.Fatalf("Attach = %v, want terminal", err)
	}
}

func waitCluster(t *testing.T, ctx context.Context, rt *kubernetes.Runtime, svc *dbcloud.Service) {
	t.Helper()
	waitFor(t, ctx, func() bool {
		var c apiv1.Cluster
		return shared.client.Get(ctx, types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: kubernetes.ClusterName(svc)}, &c) == nil
	})
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met before the deadline")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestEnsureGivesUp: a Cluster CNPG never makes healthy fails the attempt
// after WaitTimeout with CNPG's last phase as the reason.
func TestEnsureGivesUp(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{WaitTimeout: 300 * time.Millisecond})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) { c.Status.Phase = apiv1.PhaseFirstPrimary })
	_, err := rt.EnsureService(ctx, svc)
	var de *dbcloud.Error
	if !errors.As(err, &de) || dbcloud.IsTerminal(err) || !strings.Contains(de.Message, apiv1.PhaseFirstPrimary) {
		t.Fatalf("EnsureService = %v; want a retryable error naming the phase", err)
	}
}

// TestResizeWaitsForPods: CNPG publishes no observedGeneration, so after a
// resize its healthy status is the previous one; the service is running
// again only once the instances' pods carry the new resources. (Pods are
// written here as CNPG would make them; no kubelet runs them.)
func TestResizeWaitsForPods(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true})
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	ns, name := rt.Namespace(svc.ProjectID), kubernetes.ClusterName(svc)
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 1))
	var c apiv1.Cluster
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	pod := func(res corev1.ResourceRequirements) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: ns,
				Labels: map[string]string{"cnpg.io/cluster": name, "cnpg.io/podRole": "instance"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "postgres", Image: "postgres", Resources: res}}},
		}
	}
	old := pod(c.Spec.Resources)
	if err := shared.client.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	if obs, err := rt.CheckService(ctx, svc, false); err != nil || !obs.Running {
		t.Fatalf("pods as the Cluster asks: %v %+v", err, obs)
	}

	svc.Spec.Size = dbcloud.DefaultSize
	if err := rt.Apply(ctx, svc); err != nil {
		t.Fatal(err)
	}
	obs, err := rt.CheckService(ctx, svc, false)
	if err != nil || obs.Running || !strings.Contains(obs.Reason, "previous") {
		t.Fatalf("right after the resize, with the old pod: %v %+v", err, obs)
	}

	// CNPG replaces the pod with one of the new size.
	if err := shared.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &c); err != nil {
		t.Fatal(err)
	}
	if err := shared.client.Delete(ctx, old, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		return apierrors.IsNotFound(shared.client.Get(ctx, client.ObjectKeyFromObject(old), &corev1.Pod{}))
	})
	if err := shared.client.Create(ctx, pod(c.Spec.Resources)); err != nil {
		t.Fatal(err)
	}
	if obs, err := rt.CheckService(ctx, svc, false); err != nil || !obs.Running {
		t.Fatalf("pod of the new size: %v %+v", err, obs)
	}
}
