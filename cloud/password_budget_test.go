package cloud

import (
	"testing"
	"time"

	"dbcloud"
)

// budgetRuntime is a runtime whose password changes need their own budget.
type budgetRuntime struct {
	dbcloud.Runtime
	budget time.Duration
}

func (r budgetRuntime) PasswordBudget() time.Duration { return r.budget }

// TestPasswordBudget: updatePassword waits as long as the runtime says its
// change takes (CNPG's controllers), and the service layer's default
// otherwise.
func TestPasswordBudget(t *testing.T) {
	if got := New(nil, budgetRuntime{budget: 25 * time.Second}, DefaultConfig(), nil).PasswordTimeout; got != 25*time.Second {
		t.Errorf("with the runtime's 25 s budget: %v", got)
	}
	if got := New(nil, nil, DefaultConfig(), nil).PasswordTimeout; got != DefaultPasswordTimeout {
		t.Errorf("without a budget: %v, want %v", got, DefaultPasswordTimeout)
	}
}
