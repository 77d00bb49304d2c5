package kubernetes_test

import (
	"slices"
	"testing"

	apiv1 "github.com/cloudnative-pg/cloudnative-pg/api/v1"
	"k8s.io/apimachinery/pkg/types"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// TestGuardPreloaded: with Guard, every Cluster a tenant reaches, the
// service's on either version and its read replica set's, preloads
// dbcloud_guard before the addons' libraries, once however often it is
// applied; without it (an image that may lack the library), nothing is
// added.
func TestGuardPreloaded(t *testing.T) {
	ctx := testContext(t)
	for _, tc := range []struct {
		guard bool
		want  []string
	}{
		{true, []string{"dbcloud_guard", "timescaledb"}},
		{false, []string{"timescaledb"}},
	} {
		rt := newRuntime(t, kubernetes.Config{Guard: tc.guard, ImageName: "dbcloud.local/postgresql:15",
			Images: map[int]string{17: "dbcloud.local/postgresql:17"}})
		for _, major := range []int{15, 17} {
			svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true,
				PGVersion: major, Addons: []dbcloud.Addon{dbcloud.AddonTimeSeries}})
			for range 2 {
				if err := rt.Apply(ctx, svc); err != nil {
					t.Fatal(err)
				}
			}
			if got := read(t, ctx, rt, svc).cluster.Spec.PostgresConfiguration.AdditionalLibraries; !slices.Equal(got, tc.want) {
				t.Errorf("guard %v, %d: the service's shared_preload_libraries %q, want %q", tc.guard, major, got, tc.want)
			}
			set := &dbcloud.ReadReplicaSet{ID: dbcloud.NewID(), ProjectID: svc.ProjectID, ServiceID: svc.ID, Name: "reads",
				Spec: dbcloud.ReadReplicaSetSpec{Size: dbcloud.SharedSize, Nodes: 1, Environment: dbcloud.EnvDev}}
			if err := rt.ApplyReplicaSet(ctx, svc, set); err != nil {
				t.Fatal(err)
			}
			var c apiv1.Cluster
			if err := shared.client.Get(ctx, types.NamespacedName{Namespace: rt.Namespace(svc.ProjectID), Name: kubernetes.ReplicaClusterName(set)}, &c); err != nil {
				t.Fatal(err)
			}
			if got, want := c.Spec.PostgresConfiguration.AdditionalLibraries, tc.want[:len(tc.want)-1]; !slices.Equal(got, want) {
				t.Errorf("guard %v, %d: the replica set's shared_preload_libraries %q, want %q", tc.guard, major, got, want)
			}
		}
	}
}
