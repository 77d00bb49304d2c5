package kubernetes_test

import (
	"slices"
	"testing"

	"dbcloud"
	"dbcloud/runtime/kubernetes"
)

// TestPGVersionImages: the runtime offers ImageName's version and those of
// Images, and a service's Cluster runs its own version's image (a service
// recorded without a version, ImageName's).
func TestPGVersionImages(t *testing.T) {
	rt := newRuntime(t, kubernetes.Config{ImageName: "dbcloud.local/postgresql:15", Images: map[int]string{17: "dbcloud.local/postgresql:17"}})
	var majors []int
	for _, v := range rt.PGVersions() {
		majors = append(majors, v.Major)
	}
	if !slices.Equal(majors, []int{15, 17}) {
		t.Errorf("PGVersions majors = %v, want [15 17]", majors)
	}
	ctx := testContext(t)
	for _, tc := range []struct {
		major int
		image string
	}{
		{17, "dbcloud.local/postgresql:17"},
		{15, "dbcloud.local/postgresql:15"},
		{dbcloud.PGVersionUnknown, "dbcloud.local/postgresql:15"},
	} {
		svc := newService(dbcloud.ServiceSpec{Size: dbcloud.SharedSize, Environment: dbcloud.EnvDev, Running: true, PGVersion: tc.major})
		if err := rt.Apply(ctx, svc); err != nil {
			t.Fatalf("create on %d: %v", tc.major, err)
		}
		if got := read(t, ctx, rt, svc).cluster.Spec.ImageName; got != tc.image {
			t.Errorf("Cluster of a service on %d runs %q, want %q", tc.major, got, tc.image)
		}
	}
}
