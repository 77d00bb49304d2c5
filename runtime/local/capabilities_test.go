package local

import (
	"reflect"
	"testing"

	"dbcloud"
)

// TestCapabilities: the local runtime is the reference runtime, so it
// offers every optional capability the contract names. A capability added
// to dbcloud.Capabilities fails here until the local runtime has it.
func TestCapabilities(t *testing.T) {
	caps := reflect.ValueOf(dbcloud.CapabilitiesOf(&Runtime{}))
	for i := range caps.NumField() {
		if caps.Field(i).IsNil() {
			t.Errorf("the local runtime lacks the %s capability", caps.Type().Field(i).Name)
		}
	}
}
