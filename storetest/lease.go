package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dbcloud"
)

func testLease(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	acquire := func(owner string, now time.Time) bool {
		t.Helper()
		var ok bool
		MustUpdate(t, s, func(tx dbcloud.Tx) (err error) {
			ok, err = tx.AcquireLease("svc1", owner, now, now.Add(time.Minute))
			return err
		})
		return ok
	}
	if !acquire("a", t0) {
		t.Fatal("a could not take a free lease")
	}
	if acquire("b", t0.Add(30*time.Second)) {
		t.Error("b took a's unexpired lease")
	}
	if !acquire("a", t0.Add(50*time.Second)) {
		t.Error("a could not renew its own lease")
	}
	if acquire("b", t0.Add(100*time.Second)) {
		t.Error("b took a's renewed lease before it expired")
	}
	if !acquire("b", t0.Add(111*time.Second)) {
		t.Error("b could not take a's expired lease")
	}
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.ReleaseLease("svc1", "a") })
	if acquire("a", t0.Add(112*time.Second)) {
		t.Error("a's release freed b's lease")
	}
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.ReleaseLease("svc1", "b") })
	if !acquire("a", t0.Add(113*time.Second)) {
		t.Error("a could not take a released lease")
	}

	t.Run("Race", func(t *testing.T) {
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.Update(t.Context(), func(tx dbcloud.Tx) error {
					ok, err := tx.AcquireLease("race", fmt.Sprintf("owner-%d", i), t0, t0.Add(time.Minute))
					if ok {
						wins.Add(1)
					}
					return err
				})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Errorf("%d owners took one lease, want exactly 1", wins.Load())
		}
	})
}
