package sqlstore

import "testing"

type widget struct{ ID, Owner, Name string }

// TestDefine reads the statements define writes for a declaration: the
// conformance suite proves the real entities, this pins the SQL shape
// (every value a parameter, the doc last, update matching the whole key).
func TestDefine(t *testing.T) {
	e := define(entity[widget]{
		table: "widgets", noun: "widget",
		key: []string{"id", "owner"}, cols: []string{"name", "created"}, set: []string{"name"},
		values: func(w *widget) []any { return []any{w.ID, w.Owner, w.Name, "t"} },
	})
	for _, c := range []struct{ name, got, want string }{
		{"insert", e.insertSQL, `INSERT INTO widgets (id, owner, name, created, doc) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`},
		{"update", e.updateSQL, `UPDATE widgets SET name = ?, doc = ? WHERE id = ? AND owner = ?`},
		{"delete", e.deleteSQL, `DELETE FROM widgets WHERE id = ? AND owner = ?`},
		{"select", e.selectSQL + `WHERE ` + e.where, `SELECT doc FROM widgets WHERE id = ? AND owner = ?`},
	} {
		if c.got != c.want {
			t.Errorf("%s:\ngot  %s\nwant %s", c.name, c.got, c.want)
		}
	}
	if got, want := e.name("w1", "o1"), "widget w1"; got != want {
		t.Errorf("name = %q, want %q", got, want)
	}
}

// TestDefineRefusesUnstoredColumn: an update of a column the entity does
// not write would bind the wrong value; define refuses it at start-up.
func TestDefineRefusesUnstoredColumn(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("define accepted an update of a column it does not store")
		}
	}()
	define(entity[widget]{table: "widgets", key: []string{"id"}, set: []string{"name"},
		values: func(w *widget) []any { return []any{w.ID} }})
}
