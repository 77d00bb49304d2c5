package engine_test

import (
	"strings"
	"testing"
	"time"

	"dbcloud/cloud"
	"dbcloud/history"

	"dbcloud"
)

// TestEngine_OperationHistory: through the event store, the engine marks
// when it took each operation up and when it ended, records a failed
// resize with its reason, records its own repair of a lost primary as an
// operation nobody asked for, and each status change and operation end is
// an event, in order.
func TestEngine_OperationHistory(t *testing.T) {
	f := newFixture(t)
	f.store = history.NewEventStore(f.store)
	f.cloud.Store = f.store
	f.engine(t, "a")
	v, err := f.cloud.CreateService(f.ctx, f.pid, cloud.ServiceCreate{Name: "db"})
	if err != nil {
		t.Fatal(err)
	}
	id := v.Service.ID
	f.waitStatus(t, id, dbcloud.StatusReady)

	f.prov.mu.Lock()
	f.prov.failSize = &dbcloud.Size{CPUMillis: 4000, MemoryGBs: 16}
	f.prov.mu.Unlock()
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, id, "4000", "16"); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusUnstable)
	if _, err := f.cloud.ResizeService(f.ctx, f.pid, id, "1000", "4"); err != nil {
		t.Fatal(err)
	}
	f.waitStatus(t, id, dbcloud.StatusReady)

	// The primary dies; the health loop brings it back.
	f.prov.mu.Lock()
	f.prov.running[id] = false
	f.prov.mu.Unlock()
	var ops []*dbcloud.Operation
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		page, err := f.cloud.ListOperations(f.ctx, f.pid, cloud.OperationScope{ServiceID: id}, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		if ops = page.Operations; len(ops) > 0 && ops[0].Type == dbcloud.OpRestartPrimary {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no repair recorded: %+v", ops)
		}
	}
	var got []string
	for _, op := range ops {
		got = append(got, string(op.Type)+":"+string(op.State))
		if op.Started == nil || op.Finished == nil || op.Finished.Before(*op.Started) {
			t.Errorf("%s %s: started %v, finished %v", op.Type, op.ID, op.Started, op.Finished)
		}
	}
	want := "restart_primary:succeeded resize_service:succeeded resize_service:failed create_service:succeeded"
	if strings.Join(got, " ") != want {
		t.Fatalf("operations %v, want %s", got, want)
	}
	if ops[0].RequestedBy.System == "" || ops[2].Error == "" || ops[3].RequestedBy.AccessKey == "" {
		t.Errorf("repair by %+v, failed resize reason %q, create by %+v", ops[0].RequestedBy, ops[2].Error, ops[3].RequestedBy)
	}

	f.waitStatus(t, id, dbcloud.StatusReady)
	evs, err := f.cloud.ListEvents(f.ctx, f.pid, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var statuses []string
	for i, e := range evs {
		if e.ID != int64(i+1) {
			t.Fatalf("event %d has ID %d", i, e.ID)
		}
		if e.Type == dbcloud.EventServiceStatus {
			statuses = append(statuses, e.Status)
		}
	}
	wantStatuses := "QUEUED CONFIGURING READY CONFIGURING UNSTABLE CONFIGURING READY UNSTABLE READY"
	if strings.Join(statuses, " ") != wantStatuses {
		t.Errorf("statuses %v, want %s", statuses, wantStatuses)
	}
}
