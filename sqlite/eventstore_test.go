package sqlite_test

import (
	"path/filepath"
	"testing"

	"dbcloud/cloud"
	"dbcloud/history"

	"dbcloud"
)

// TestEventStore_KeepsSeries: the event store that dbcloud serve wraps
// around the store leaves the metrics history on: the Cloud finds the
// series store beneath it.
func TestEventStore_KeepsSeries(t *testing.T) {
	s := MustOpen(t, filepath.Join(t.TempDir(), "db"))
	if _, ok := any(s).(dbcloud.SeriesStore); !ok {
		t.Fatal("the SQLite store keeps no metrics series")
	}
	c := cloud.New(history.NewEventStore(s), nil, cloud.DefaultConfig(), nil)
	if c.History == nil {
		t.Fatal("no metrics history over an event store")
	}
}
