package sqlstore_test

import (
	"testing"
	"testing/fstest"

	"dbcloud/sqlstore"
)

func TestRebind(t *testing.T) {
	tests := []struct {
		name  string
		p     sqlstore.Placeholder
		query string
		want  string
	}{
		{"QuestionMark", sqlstore.QuestionMark, `SELECT doc FROM t WHERE a = ? AND b = ?`, `SELECT doc FROM t WHERE a = ? AND b = ?`},
		{"Dollar", sqlstore.Dollar, `SELECT doc FROM t WHERE a = ? AND b = ?`, `SELECT doc FROM t WHERE a = $1 AND b = $2`},
		{"DollarMany", sqlstore.Dollar, `VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, `VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`},
		{"NoParameters", sqlstore.Dollar, `SELECT 1`, `SELECT 1`},
		{"Literal", sqlstore.Dollar, `SELECT '?', "a?b" FROM t WHERE s = 'it''s?' AND x = ?`, `SELECT '?', "a?b" FROM t WHERE s = 'it''s?' AND x = $1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sqlstore.Rebind(tt.p, tt.query); got != tt.want {
				t.Errorf("Rebind(%q)\ngot  %q\nwant %q", tt.query, got, tt.want)
			}
		})
	}
}

func TestLoadMigrations(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		fsys := fstest.MapFS{
			"0010_later.sql":   {Data: []byte("CREATE TABLE b (x INTEGER);")},
			"0002_second.sql":  {Data: []byte("CREATE TABLE a (x INTEGER);")},
			"0001_initial.sql": {Data: []byte("CREATE TABLE c (x INTEGER);")},
			"README.md":        {Data: []byte("not a migration")},
		}
		migs, err := sqlstore.LoadMigrations(fsys)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, m := range migs {
			got = append(got, m.Version)
		}
		if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 10 {
			t.Errorf("versions = %v, want [1 2 10]", got)
		}
		if migs[2].Name != "0010_later.sql" || migs[2].SQL != "CREATE TABLE b (x INTEGER);" {
			t.Errorf("last migration = %+v", migs[2])
		}
	})
	for name, fsys := range map[string]fstest.MapFS{
		"ErrDuplicateVersion": {"0001_a.sql": {}, "001_b.sql": {}},
		"ErrNoVersion":        {"initial.sql": {}},
		"ErrZeroVersion":      {"0000_initial.sql": {}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := sqlstore.LoadMigrations(fsys); err == nil {
				t.Error("LoadMigrations succeeded, want an error")
			}
		})
	}
}
