package kubernetes

import (
	"reflect"
	"slices"
	"testing"

	"dbcloud"
)

// TestCapabilities: the Kubernetes runtime offers exactly the optional
// capabilities its declaration in runtime.go names, so the engine and the
// service layer neither skip one it has nor ask for one it lacks.
func TestCapabilities(t *testing.T) {
	want := []string{"ReplicaSets", "Backups", "PasswordBudget"}
	caps := reflect.ValueOf(dbcloud.CapabilitiesOf(&Runtime{}))
	for i := range caps.NumField() {
		name := caps.Type().Field(i).Name
		if has := !caps.Field(i).IsNil(); has != slices.Contains(want, name) {
			t.Errorf("capability %s: has %v, the declaration says %v", name, has, !has)
		}
	}
}
