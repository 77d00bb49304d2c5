package kubernetes_test

import (
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"dbcloud/cloud"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"dbcloud"
	"dbcloud/engine"
	"dbcloud/runtime/kubernetes"
	"dbcloud/sqlite"
)

// TestControlPlane drives the runtime through dbcloud's own domain and
// engine, as `serve --runtime kubernetes` does, with the test playing
// CNPG's operator: a create becomes READY once the Cluster reports healthy,
// updatePassword returns after CNPG applied the Secret, a stop is PAUSED
// once hibernated, VPCs are refused, and a delete removes the Cluster.
func TestControlPlane(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{})
	ctx := testContext(t)
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := cloud.New(store, rt, cloud.DefaultConfig(), logger)
	cl.Network = kubernetes.Network{}
	e := engine.New(store, rt, "kube-test", logger)
	e.PollInterval, e.HealthInterval = 20*time.Millisecond, 50*time.Millisecond
	e.Network = kubernetes.Network{}
	if err := e.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cl.Notify = e.Notify
	b, err := cl.Bootstrap(ctx, "admin", "admin@example.com")
	if err != nil {
		t.Fatal(err)
	}
	p, err := cl.Authenticate(ctx, b.Key.AccessKey, b.Key.SecretKey)
	if err != nil {
		t.Fatal(err)
	}
	pctx := cloud.NewContextWithPrincipal(ctx, p)
	pid := b.Project.ID

	v, err := cl.CreateService(pctx, pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	svc := v.Service
	name := kubernetes.ClusterName(svc)
	key := types.NamespacedName{Namespace: rt.Namespace(pid), Name: name}
	status := func(want dbcloud.ServiceStatus) *dbcloud.Service {
		t.Helper()
		var got *cloud.ServiceView
		waitFor(t, ctx, func() bool {
			got, err = cl.GetService(pctx, pid, svc.ID)
			return err == nil && got.Service.Status == want
		})
		return got.Service
	}

	waitCluster(t, ctx, rt, svc)
	if s := status(dbcloud.StatusConfiguring); s.StatusReason != "" {
		t.Fatalf("configuring with reason %q", s.StatusReason)
	}
	writeStatus(t, ctx, rt, svc, healthy(name, name+"-1", 1))
	if s := status(dbcloud.StatusReady); len(s.Instances) != 1 || s.Instances[0].ID != name+"-1" {
		t.Fatalf("READY with instances %+v", s.Instances)
	}

	// updatePassword: the 204 waits for CNPG's report of the new Secret.
	done := make(chan error, 1)
	go func() { done <- cl.UpdatePassword(pctx, pid, svc.ID, "a-new-password-of-some-length") }()
	var secret corev1.Secret
	waitFor(t, ctx, func() bool {
		err := shared.client.Get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: kubernetes.SecretName(name)}, &secret)
		return err == nil && string(secret.Data["password"]) != svc.PasswordVerifier
	})
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
		c.Status.ManagedRolesStatus.PasswordStatus = map[string]apiv1.PasswordState{"tsdbadmin": {SecretResourceVersion: secret.ResourceVersion}}
	})
	if err := <-done; err != nil {
		t.Fatalf("UpdatePassword: %v", err)
	}

	_, err = cl.CreateVPC(pctx, pid, cloud.VPCCreate{Name: "v", CIDR: "10.0.0.0/16", Region: cloud.DefaultConfig().Regions[0]})
	var de *dbcloud.Error
	if !errors.As(err, &de) || de.Code != kubernetes.CodeUnsupported {
		t.Fatalf("CreateVPC: %v, want UNSUPPORTED", err)
	}

	if _, err := cl.StopService(pctx, pid, svc.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		var c apiv1.Cluster
		return shared.client.Get(ctx, key, &c) == nil && c.Annotations[kubernetes.HibernationAnnotation] == "on"
	})
	writeStatus(t, ctx, rt, svc, func(c *apiv1.Cluster) {
		meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: "cnpg.io/hibernation", Status: metav1.ConditionTrue,
			Reason: "Hibernated", Message: "Cluster has been hibernated"})
	})
	status(dbcloud.StatusPaused)

	if err := cl.DeleteService(pctx, pid, svc.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		_, err := cl.GetService(pctx, pid, svc.ID)
		return dbcloud.IsNotFound(err)
	})
	var c apiv1.Cluster
	if err := shared.client.Get(ctx, key, &c); !apierrors.IsNotFound(err) {
		t.Fatalf("the Cluster after delete: %v", err)
	}
}
