package storetest

import (
	"sync"
	"testing"

	"dbcloud"
)

// testHistory covers what clients read of the past: operations by parent,
// newest first and paged; events with per-project IDs in commit order;
// and the retention deletes.
func testHistory(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	opID := func(o *dbcloud.Operation) string { return o.ID }
	svcOp := newOperation("p1", "svc1", "h1", dbcloud.OpSucceeded, at(1))
	setOp := newOperation("p1", "rs1", "h2", dbcloud.OpFailed, at(2))
	setOp.ParentID = "svc1"
	sameTime := newOperation("p1", "svc1", "h3", dbcloud.OpPending, at(2))
	other := newOperation("p1", "svc2", "h4", dbcloud.OpSucceeded, at(3))
	insert(t, s, dbcloud.Tx.InsertOperation, svcOp, setOp, sameTime, other)

	t.Run("Operations", func(t *testing.T) {
		tests := []struct {
			filter dbcloud.OperationFilter
			want   []string
		}{
			{dbcloud.OperationFilter{Subject: "svc1"}, []string{"h1", "h2", "h3"}},
			{dbcloud.OperationFilter{Subject: "svc1", Newest: true}, []string{"h3", "h2", "h1"}},
			{dbcloud.OperationFilter{Subject: "svc1", Newest: true, Before: sameTime}, []string{"h2", "h1"}},
			{dbcloud.OperationFilter{Subject: "svc1", Newest: true, Before: setOp, Limit: 5}, []string{"h1"}},
			{dbcloud.OperationFilter{ResourceID: "rs1"}, []string{"h2"}},
			{dbcloud.OperationFilter{Subject: "rs1"}, []string{"h2"}},
		}
		for _, tt := range tests {
			got := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Operation, error) { return tx.ListOperations(tt.filter) })
			equal(t, "ListOperations IDs "+show(tt.filter), ids(got, opID), tt.want)
		}
		got := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Operation, error) { return tx.FindOperation("h2") })
		equal(t, "FindOperation with parent", got, setOp)
	})

	t.Run("Events", func(t *testing.T) {
		// Concurrent writers of one project get IDs 1..n, each once.
		const writers, each = 4, 5
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					MustUpdate(t, s, func(tx dbcloud.Tx) error {
						return tx.InsertEvent(&dbcloud.Event{ProjectID: "ev1", Type: dbcloud.EventServiceStatus, Time: at(i), ResourceID: "svc"})
					})
				}
			}()
		}
		wg.Wait()
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			return tx.InsertEvent(&dbcloud.Event{ProjectID: "ev2", Type: dbcloud.EventFailover, Time: at(100), Primary: "x-1"})
		})
		all := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Event, error) { return tx.ListEvents("ev1", 0, 100) })
		if len(all) != writers*each {
			t.Fatalf("ListEvents: %d events, want %d", len(all), writers*each)
		}
		for i, e := range all {
			if e.ID != int64(i+1) {
				t.Fatalf("event %d has ID %d", i, e.ID)
			}
		}
		page := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Event, error) { return tx.ListEvents("ev1", 7, 3) })
		if len(page) != 3 || page[0].ID != 8 || page[2].ID != 10 {
			t.Errorf("ListEvents after 7, limit 3: %+v", page)
		}
		other := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Event, error) { return tx.ListEvents("ev2", 0, 10) })
		equal(t, "ListEvents of another project", other, []*dbcloud.Event{{ID: 1, ProjectID: "ev2", Type: dbcloud.EventFailover, Time: at(100), Primary: "x-1"}})
	})

	t.Run("Retention", func(t *testing.T) {
		var nOps, nEvents int
		MustUpdate(t, s, func(tx dbcloud.Tx) (err error) {
			if nOps, err = tx.DeleteOperationsBefore(at(3)); err != nil {
				return err
			}
			nEvents, err = tx.DeleteEventsBefore(at(3))
			return err
		})
		// h1 and h2 are finished and older; h3 is pending; h4 is not older.
		if nOps != 2 {
			t.Errorf("DeleteOperationsBefore deleted %d, want 2", nOps)
		}
		left := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Operation, error) {
			return tx.ListOperations(dbcloud.OperationFilter{})
		})
		equal(t, "operations left", ids(left, opID), []string{"h3", "h4"})
		// at(0), at(1) and at(2) of each of the 4 writers.
		if nEvents != 12 {
			t.Errorf("DeleteEventsBefore deleted %d, want 12", nEvents)
		}
		// IDs are never reused after a purge.
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			return tx.InsertEvent(&dbcloud.Event{ProjectID: "ev1", Type: dbcloud.EventServiceStatus, Time: at(200)})
		})
		last := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Event, error) { return tx.ListEvents("ev1", 20, 10) })
		if len(last) != 1 || last[0].ID != 21 {
			t.Errorf("event after the purge: %+v", last)
		}
	})
}
