// Package storetest is the conformance suite of dbcloud.Store. Every store
// implementation runs the same RunStoreTests against a real database, so
// the SQLite and PostgreSQL stores are proven to behave alike: same
// sentinels, same ordering, same transaction semantics.
package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"dbcloud"
)

// Opener opens a Store over one database. Every call returns a new Store
// over the same data, so a test can close a store and open it again; the
// Opener closes each store it returns when the test ends (Close must
// therefore be safe to call twice).
type Opener func(tb testing.TB) dbcloud.Store

// NewDB prepares an empty database for one test or benchmark and returns
// its Opener. It fails tb rather than skipping: a suite that does not run
// must not pass.
type NewDB func(tb testing.TB) Opener

// RunStoreTests runs the conformance suite against the store newDB makes.
// Every subtest gets a database of its own and runs in parallel.
func RunStoreTests(t *testing.T, newDB NewDB) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newDB NewDB)
	}{
		{"User", testUser},
		{"Membership", testMembership},
		{"UserToken", testUserToken},
		{"Invitation", testInvitation},
		{"APIKeyLastUsed", testAPIKeyLastUsed},
		{"Project", testProject},
		{"APIKey", testAPIKey},
		{"Service", testService},
		{"ReplicaSet", testReplicaSet},
		{"VPC", testVPC},
		{"Peering", testPeering},
		{"Credential", testCredential},
		{"Operation", testOperation},
		{"History", testHistory},
		{"Port", testPort},
		{"Idempotency", testIdempotency},
		{"Lease", testLease},
		{"Series", testSeries},
		{"SeriesBounded", testSeriesBounded},
		{"SeriesAvg", testSeriesAvg},
		{"Time", testTime},
		{"Update", testUpdate},
		{"View", testView},
		{"Concurrency", testConcurrency},
		{"Reopen", testReopen},
		{"Revision", testRevision},
		{"RevisionElsewhere", testRevisionElsewhere},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newDB)
		})
	}
}

// MustOpen opens a store over a fresh database.
func MustOpen(tb testing.TB, newDB NewDB) dbcloud.Store {
	tb.Helper()
	return newDB(tb)(tb)
}

// MustUpdate runs fn in an Update and fails tb on error.
func MustUpdate(tb testing.TB, s dbcloud.Store, fn func(tx dbcloud.Tx) error) {
	tb.Helper()
	if err := s.Update(tb.Context(), fn); err != nil {
		tb.Fatalf("Update: %v", err)
	}
}

// MustView runs fn in a View and fails tb on error.
func MustView(tb testing.TB, s dbcloud.Store, fn func(tx dbcloud.Tx) error) {
	tb.Helper()
	if err := s.View(tb.Context(), fn); err != nil {
		tb.Fatalf("View: %v", err)
	}
}

// view runs fn in a View and returns its result, failing tb on error.
func view[T any](tb testing.TB, s dbcloud.Store, fn func(tx dbcloud.Tx) (T, error)) T {
	tb.Helper()
	var out T
	MustView(tb, s, func(tx dbcloud.Tx) (err error) {
		out, err = fn(tx)
		return err
	})
	return out
}

// insert runs one insert in its own Update, failing tb on error.
func insert[T any](tb testing.TB, s dbcloud.Store, fn func(dbcloud.Tx, T) error, vs ...T) {
	tb.Helper()
	MustUpdate(tb, s, func(tx dbcloud.Tx) error {
		for _, v := range vs {
			if err := fn(tx, v); err != nil {
				return err
			}
		}
		return nil
	})
}

// update runs fn in an Update and returns its error, for tests that want one.
func update(tb testing.TB, s dbcloud.Store, fn func(tx dbcloud.Tx) error) error {
	tb.Helper()
	return s.Update(tb.Context(), fn)
}

// equal fails tb unless got and want are deeply equal. Entities are shown
// as JSON (with Go syntax as well, since APIKey hides its hash from JSON).
func equal(tb testing.TB, what string, got, want any) {
	tb.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	tb.Errorf("%s:\ngot  %s\nwant %s\ngot  %#v\nwant %#v", what, show(got), show(want), got, want)
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// wantNotFound fails tb unless err is the store's not-found sentinel and
// the domain recognises it as not found.
func wantNotFound(tb testing.TB, what string, err error) {
	tb.Helper()
	if !errors.Is(err, dbcloud.ErrNotFound) || !dbcloud.IsNotFound(err) {
		tb.Errorf("%s: got error %v, want ErrNotFound", what, err)
	}
}

// wantDuplicate fails tb unless err is the store's duplicate sentinel and
// the domain recognises it as a conflict.
func wantDuplicate(tb testing.TB, what string, err error) {
	tb.Helper()
	if !errors.Is(err, dbcloud.ErrDuplicate) || !dbcloud.IsConflict(err) {
		tb.Errorf("%s: got error %v, want ErrDuplicate", what, err)
	}
}

// ids returns the IDs of entities, to compare list orders readably.
func ids[T any](list []*T, id func(*T) string) []string {
	out := make([]string, len(list))
	for i, v := range list {
		out[i] = id(v)
	}
	return out
}
