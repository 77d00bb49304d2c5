package storetest

import (
	"fmt"
	"testing"

	"dbcloud/history"

	"dbcloud"
)

// benchServices is the size of the project the benchmarks read: the
// default quota is 100 services, so 1,000 is a generous upper bound.
const benchServices = 1000

// BenchmarkUpdateService measures an Update that locks the project, reads
// one service among 1,000 and writes it back: the shape of every change
// request, and the one that pays for each commit's durability.
func BenchmarkUpdateService(b *testing.B, newDB NewDB) {
	s := seedServices(b, newDB)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := serviceID(i % benchServices)
		i++
		err := s.Update(b.Context(), func(tx dbcloud.Tx) error {
			if err := tx.LockProject("p1"); err != nil {
				return err
			}
			svc, err := tx.FindService("p1", id)
			if err != nil {
				return err
			}
			svc.Generation++
			return tx.UpdateService(svc)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkListServices measures a View that lists a project of 1,000
// services, the read behind GET /projects/{id}/services.
func BenchmarkListServices(b *testing.B, newDB NewDB) {
	s := seedServices(b, newDB)
	b.ReportAllocs()
	for b.Loop() {
		err := s.View(b.Context(), func(tx dbcloud.Tx) error {
			svcs, err := tx.ListServices("p1")
			if err == nil && len(svcs) != benchServices {
				err = fmt.Errorf("listed %d services, want %d", len(svcs), benchServices)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFindService measures a View that finds one service among 1,000,
// the read behind every request about one service.
func BenchmarkFindService(b *testing.B, newDB NewDB) {
	s := seedServices(b, newDB)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		id := serviceID(i % benchServices)
		i++
		err := s.View(b.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindService("p1", id)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func serviceID(i int) string { return fmt.Sprintf("svc%07d", i) }

// seedServices opens a fresh store holding project p1 with benchServices
// fully populated services.
func seedServices(b *testing.B, newDB NewDB) dbcloud.Store {
	b.Helper()
	s := MustOpen(b, newDB)
	MustUpdate(b, s, func(tx dbcloud.Tx) error {
		if err := tx.InsertProject(newProject("p1", at(0))); err != nil {
			return err
		}
		for i := range benchServices {
			if err := tx.InsertService(NewService("p1", serviceID(i), at(i))); err != nil {
				return err
			}
		}
		return nil
	})
	return s
}

// BenchmarkStatusChange measures the change of a service's status, the
// write the engine makes at every step, without ("plain") and with
// ("events") the event that dbcloud.EventStore records in the same
// transaction: the cost of the event stream on every change.
func BenchmarkStatusChange(b *testing.B, newDB NewDB) {
	for _, events := range []bool{false, true} {
		name := "plain"
		if events {
			name = "events"
		}
		b.Run(name, func(b *testing.B) {
			s := seedServices(b, newDB)
			if events {
				s = history.NewEventStore(s)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				id := serviceID(i % benchServices)
				i++
				err := s.Update(b.Context(), func(tx dbcloud.Tx) error {
					svc, err := tx.FindService("p1", id)
					if err != nil {
						return err
					}
					if svc.Status == dbcloud.StatusReady {
						svc.Status = dbcloud.StatusConfiguring
					} else {
						svc.Status = dbcloud.StatusReady
					}
					return tx.UpdateService(svc)
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
