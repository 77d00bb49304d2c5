package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"dbcloud"
)

func testTime(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	t.Run("UTC", func(t *testing.T) {
		// Whatever zone a time is written in, it comes back as the same
		// instant in UTC, without a monotonic reading, so that stored
		// entities compare equal with reflect.DeepEqual.
		zone := time.FixedZone("UTC+5:30", 5*3600+1800)
		now := time.Now().In(zone)
		svc := NewService("p1", "svc1", now)
		svc.Metrics.Measured = now.Add(time.Second)
		svc.Fork.TargetTime = ptr(now.Add(-time.Second))
		insert(t, s, dbcloud.Tx.InsertService, svc)
		got := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Service, error) { return tx.FindService("p1", "svc1") })
		for _, tt := range []struct {
			name      string
			got, want time.Time
		}{
			{"Created", got.Created, svc.Created},
			{"Metrics.Measured", got.Metrics.Measured, svc.Metrics.Measured},
			{"Fork.TargetTime", *got.Fork.TargetTime, *svc.Fork.TargetTime},
		} {
			if tt.got != tt.want.UTC().Round(0) {
				t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want.UTC().Round(0))
			}
		}
	})
	t.Run("Zero", func(t *testing.T) {
		op := newOperation("p1", "svc1", "op1", dbcloud.OpPending, time.Time{})
		op.LeaseExpires = time.Time{}
		insert(t, s, dbcloud.Tx.InsertOperation, op)
		got := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Operation, error) { return tx.FindOperation("op1") })
		equal(t, "FindOperation with zero times", got, op)
	})
}

func testUpdate(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	projectExists := func(t *testing.T, id string) bool {
		t.Helper()
		var found bool
		MustView(t, s, func(tx dbcloud.Tx) error {
			_, err := tx.FindProject(id)
			if err != nil && !dbcloud.IsNotFound(err) {
				return err
			}
			found = err == nil
			return nil
		})
		return found
	}

	t.Run("OK", func(t *testing.T) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			if err := tx.InsertProject(newProject("ok", at(1))); err != nil {
				return err
			}
			// A transaction reads its own writes.
			_, err := tx.FindProject("ok")
			return err
		})
		if !projectExists(t, "ok") {
			t.Error("project of a committed Update is missing")
		}
	})
	t.Run("ErrRollback", func(t *testing.T) {
		boom := errors.New("boom")
		err := s.Update(t.Context(), func(tx dbcloud.Tx) error {
			if err := tx.InsertProject(newProject("rolled-back", at(1))); err != nil {
				return err
			}
			if err := tx.ClaimPort(1, "rolled-back"); err != nil {
				return err
			}
			return fmt.Errorf("later step: %w", boom)
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Update = %v, want the error fn returned", err)
		}
		if projectExists(t, "rolled-back") {
			t.Error("Update whose fn failed wrote its project")
		}
		equal(t, "ports after a failed Update", view(t, s, dbcloud.Tx.ListPorts), map[int]string{})
	})
	t.Run("Panic", func(t *testing.T) {
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Errorf("recovered %v, want the panic of fn", r)
				}
			}()
			_ = s.Update(t.Context(), func(tx dbcloud.Tx) error {
				if err := tx.InsertProject(newProject("panicked", at(1))); err != nil {
					return err
				}
				panic("boom")
			})
		}()
		if projectExists(t, "panicked") {
			t.Error("Update whose fn panicked wrote its project")
		}
		// The store is still usable: the transaction did not leak.
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("after-panic", at(1))) })
	})
	t.Run("AfterErrDuplicate", func(t *testing.T) {
		// ErrDuplicate leaves the transaction usable (on PostgreSQL an
		// unhandled unique violation would abort it), so a caller may try
		// the next port and commit.
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			if err := tx.InsertProject(newProject("dup", at(1))); err != nil {
				return err
			}
			wantDuplicate(t, "InsertProject", tx.InsertProject(newProject("dup", at(2))))
			if err := tx.ClaimPort(100, "dup"); err != nil {
				return err
			}
			wantDuplicate(t, "ClaimPort", tx.ClaimPort(100, "other"))
			return tx.ClaimPort(101, "other")
		})
		if !projectExists(t, "dup") {
			t.Error("project missing after a committed Update with a duplicate")
		}
		ports := view(t, s, dbcloud.Tx.ListPorts)
		if ports[100] != "dup" || ports[101] != "other" {
			t.Errorf("ListPorts = %v, want 100 held by dup and 101 by other", ports)
		}
	})
	t.Run("Uncommitted", func(t *testing.T) {
		// Others see nothing of a transaction before it commits.
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			if err := tx.InsertProject(newProject("uncommitted", at(1))); err != nil {
				return err
			}
			if projectExists(t, "uncommitted") {
				t.Error("a View saw the project of an uncommitted Update")
			}
			return nil
		})
		if !projectExists(t, "uncommitted") {
			t.Error("project missing after commit")
		}
	})
	t.Run("ErrCanceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := s.Update(ctx, func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("canceled", at(1))) })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Update with a canceled context = %v, want context.Canceled", err)
		}
		if projectExists(t, "canceled") {
			t.Error("Update with a canceled context wrote its project")
		}
	})
}

func testView(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	t.Run("ErrReadOnly", func(t *testing.T) {
		err := s.View(t.Context(), func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p1", at(1))) })
		if err == nil || errors.Is(err, dbcloud.ErrDuplicate) {
			t.Errorf("insert in a View = %v, want a read-only error", err)
		}
		err = s.View(t.Context(), func(tx dbcloud.Tx) error { return tx.ClaimPort(1, "p1") })
		if err == nil {
			t.Error("ClaimPort in a View succeeded, want a read-only error")
		}
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindProject("p1")
			wantNotFound(t, "FindProject after an insert in a View", err)
			return nil
		})
	})
	t.Run("Error", func(t *testing.T) {
		boom := errors.New("boom")
		if err := s.View(t.Context(), func(dbcloud.Tx) error { return boom }); !errors.Is(err, boom) {
			t.Errorf("View = %v, want the error fn returned", err)
		}
	})
}

// writers is how many goroutines write one project at once; enough to make
// collisions certain, few enough to stay within PostgreSQL's connections.
const writers = 20

func testConcurrency(t *testing.T, newDB NewDB) {
	t.Run("LockProject", func(t *testing.T) {
		// Each writer counts the project's services and names its own by
		// the count, as a quota check would. Only writers serialised by
		// LockProject give every service a different name, and none may
		// fail with a busy or serialisation error.
		s := MustOpen(t, newDB)
		insert(t, s, dbcloud.Tx.InsertProject, newProject("p1", at(0)))
		done := make(chan struct{})
		var readers sync.WaitGroup
		for range 4 {
			readers.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					if err := s.View(t.Context(), func(tx dbcloud.Tx) error {
						_, err := tx.ListServices("p1")
						return err
					}); err != nil {
						t.Errorf("concurrent View: %v", err)
						return
					}
				}
			})
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Go(func() {
				errs <- s.Update(t.Context(), func(tx dbcloud.Tx) error {
					if err := tx.LockProject("p1"); err != nil {
						return err
					}
					svcs, err := tx.ListServices("p1")
					if err != nil {
						return err
					}
					svc := NewService("p1", fmt.Sprintf("svc%02d", i), at(len(svcs)))
					svc.Name = strconv.Itoa(len(svcs))
					return tx.InsertService(svc)
				})
			})
		}
		wg.Wait()
		close(done)
		readers.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Update: %v", err)
			}
		}
		svcs := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Service, error) { return tx.ListServices("p1") })
		names := ids(svcs, func(s *dbcloud.Service) string { return s.Name })
		// Created at(count), so listed in count order.
		want := make([]string, writers)
		for i := range want {
			want[i] = strconv.Itoa(i)
		}
		equal(t, "service names (each the count its writer saw)", names, want)
	})
	t.Run("ReadModifyWrite", func(t *testing.T) {
		// Writers that find a row and update it, without LockProject (as
		// the engine records progress), lose no update: each sees the
		// change of the one before.
		s := MustOpen(t, newDB)
		insert(t, s, dbcloud.Tx.InsertService, NewService("p1", "svc1", at(0)))
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for range writers {
			wg.Go(func() {
				errs <- s.Update(t.Context(), func(tx dbcloud.Tx) error {
					svc, err := tx.FindService("p1", "svc1")
					if err != nil {
						return err
					}
					svc.ObservedGeneration++
					return tx.UpdateService(svc)
				})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Update: %v", err)
			}
		}
		svc := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Service, error) { return tx.FindService("p1", "svc1") })
		if want := NewService("p1", "svc1", at(0)).ObservedGeneration + writers; svc.ObservedGeneration != want {
			t.Errorf("ObservedGeneration = %d, want %d", svc.ObservedGeneration, want)
		}
	})
	t.Run("ClaimPort", func(t *testing.T) {
		// Writers of different projects do not serialise on a project
		// lock, yet only one of them gets a port.
		s := MustOpen(t, newDB)
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Go(func() {
				owner := fmt.Sprintf("svc%02d", i)
				errs <- s.Update(t.Context(), func(tx dbcloud.Tx) error {
					if err := tx.LockProject("p" + owner); err != nil {
						return err
					}
					return tx.ClaimPort(20000, owner)
				})
			})
		}
		wg.Wait()
		close(errs)
		won := 0
		for err := range errs {
			switch {
			case err == nil:
				won++
			case errors.Is(err, dbcloud.ErrDuplicate):
			default:
				t.Errorf("concurrent ClaimPort: %v", err)
			}
		}
		if won != 1 {
			t.Errorf("%d writers claimed the port, want 1", won)
		}
		if ports := view(t, s, dbcloud.Tx.ListPorts); len(ports) != 1 {
			t.Errorf("ListPorts = %v, want one port", ports)
		}
	})
}

func testReopen(t *testing.T, newDB NewDB) {
	open := newDB(t)
	s := open(t)
	p := newProject("p1", at(1))
	svc := NewService("p1", "svc1", at(2))
	MustUpdate(t, s, func(tx dbcloud.Tx) error {
		return errors.Join(tx.InsertProject(p), tx.InsertService(svc), tx.ClaimPort(15432, "svc1"))
	})
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s = open(t)
	equal(t, "FindProject after reopen", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Project, error) { return tx.FindProject("p1") }), p)
	equal(t, "FindService after reopen", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Service, error) { return tx.FindService("p1", "svc1") }), svc)
	equal(t, "ListPorts after reopen", view(t, s, dbcloud.Tx.ListPorts), map[int]string{15432: "svc1"})
	// The reopened store writes too: migrations found the schema complete.
	MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p2", at(3))) })
}
