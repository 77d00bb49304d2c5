package postgres

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"dbcloud/runtime/local/internal/osuser"
)

func goldenSpec() Spec {
	return Spec{
		ID:         "svc-0",
		Dir:        "/srv/dbcloud/svc-0",
		ListenAddr: "127.0.0.1",
		Port:       5433,
		Settings: map[string]string{
			"work_mem":        "4MB",
			"Shared_Buffers":  "128MB",
			"search_path":     `"$user", public`,
			"dbcloud.note":    `it's a\test`,
			"max_wal_senders": "5", // a default a size may override
		},
		ArchiveDir: "/srv/dbcloud/archive",
	}
}

const goldenConf = `# Written by dbcloud for instance svc-0; rewritten on every change, do not edit.

# Connections
listen_addresses = '127.0.0.1'
port = 5433
unix_socket_directories = '/srv/dbcloud/svc-0/run'
cluster_name = 'svc-0'
ssl = on
ssl_cert_file = '/srv/dbcloud/svc-0/conf/server.crt'
ssl_key_file = '/srv/dbcloud/svc-0/conf/server.key'
ssl_min_protocol_version = 'TLSv1.2'
ssl_ciphers = 'ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305'
password_encryption = 'scram-sha-256'

# Logs: JSON lines outside the data directory, read by dbcloud
logging_collector = on
log_destination = 'jsonlog'
log_directory = '/srv/dbcloud/svc-0/log'
log_filename = 'postgresql-%Y-%m-%d_%H%M%S.log'
log_rotation_age = 60
log_rotation_size = '100MB'
log_truncate_on_rotation = off
log_timezone = 'UTC'

# The control plane decides what happens after a crash
restart_after_crash = off

# WAL archive of the service, for snapshots and point-in-time forks
archive_mode = on
archive_library = 'basic_archive'
basic_archive.archive_directory = '/srv/dbcloud/archive'
archive_timeout = '60s'

# Tenant guard, after the libraries the service size adds
shared_preload_libraries = 'dbcloud_guard'

# Defaults
datestyle = 'iso, mdy'
default_text_search_config = 'pg_catalog.english'
lc_messages = 'C'
lc_monetary = 'C'
lc_numeric = 'C'
lc_time = 'C'
max_replication_slots = '64'
timezone = 'UTC'
wal_level = 'replica'

# Service size
dbcloud.note = 'it''s a\\test'
max_wal_senders = '5'
search_path = '"$user", public'
shared_buffers = '128MB'
work_mem = '4MB'
`

const goldenHBA = `# Written by dbcloud; rewritten on every change, do not edit.
# TYPE  DATABASE     USER      ADDRESS       METHOD
local   all          postgres                peer map=dbcloud
local   replication  postgres                peer map=dbcloud
local   all          dbcloud_pooler          peer map=dbcloud_pooler
local   all          dbcloud_replicator      peer map=dbcloud_replicator
local   replication  dbcloud_replicator      peer map=dbcloud_replicator
local   dbcloud      all                     reject
host    dbcloud      all       0.0.0.0/0     reject
host    dbcloud      all       ::/0          reject
local   all          all                     scram-sha-256
hostssl all          all       0.0.0.0/0     scram-sha-256
hostssl all          all       ::/0          scram-sha-256
hostssl replication  all       127.0.0.1/32  scram-sha-256
host    all          all       0.0.0.0/0     reject
host    all          all       ::/0          reject
`

const goldenIdent = `# Written by dbcloud; rewritten on every change, do not edit.
# MAPNAME  SYSTEM-USERNAME  PG-USERNAME
dbcloud    root  postgres
dbcloud_pooler    root  dbcloud_pooler
dbcloud_pooler    postgres  dbcloud_pooler
dbcloud_replicator    postgres  dbcloud_replicator
`

func TestRenderConfig(t *testing.T) {
	t.Run("Golden", func(t *testing.T) {
		conf, hba, ident := RenderConfig(goldenSpec(), "root")
		for _, c := range []struct{ name, got, want string }{
			{"postgresql.conf", conf, goldenConf},
			{"pg_hba.conf", hba, goldenHBA},
			{"pg_ident.conf", ident, goldenIdent},
		} {
			if c.got != c.want {
				t.Errorf("%s:\n got:\n%s\nwant:\n%s", c.name, c.got, c.want)
			}
		}
	})
	t.Run("Sealed", func(t *testing.T) {
		// A fork's first start: nobody in over TCP, nor by password over
		// the socket, while its roles have the parent's passwords; only
		// dbcloud by peer identity. The same conf, so opening it is a reload.
		s := goldenSpec()
		s.Sealed = true
		conf, hba, _ := RenderConfig(s, "root")
		if conf != goldenConf {
			t.Error("sealing changed postgresql.conf")
		}
		for _, line := range strings.Split(hba, "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || strings.HasPrefix(f[0], "#") {
				continue
			}
			if method := f[len(f)-1]; f[0] != "local" && method != "reject" || f[0] == "local" && method != "reject" && !strings.HasPrefix(method, "map=") {
				t.Errorf("sealed pg_hba.conf lets in more than dbcloud: %q", line)
			}
		}
		if !strings.Contains(hba, "local   all          postgres                peer map=") {
			t.Errorf("sealed pg_hba.conf keeps dbcloud out:\n%s", hba)
		}
	})
	t.Run("Deterministic", func(t *testing.T) {
		a, _, _ := RenderConfig(goldenSpec(), "root")
		for range 20 {
			if b, _, _ := RenderConfig(goldenSpec(), "root"); b != a {
				t.Fatal("two renders of one spec differ")
			}
		}
	})
	t.Run("FixedSettingsNotOverridden", func(t *testing.T) {
		s := goldenSpec()
		s.Settings = map[string]string{"port": "1", "SSL": "off", "bad name": "x"}
		conf, _, _ := RenderConfig(s, "root")
		if strings.Count(conf, "\nport = ") != 1 || !strings.Contains(conf, "\nport = 5433\n") ||
			strings.Contains(conf, "ssl = 'off'") || strings.Contains(conf, "bad name") {
			t.Errorf("fixed settings overridden or invalid name rendered:\n%s", conf)
		}
	})
	t.Run("NoArchiveDirNoArchiving", func(t *testing.T) {
		s := goldenSpec()
		s.ArchiveDir = ""
		conf, _, _ := RenderConfig(s, "root")
		if strings.Contains(conf, "archive") {
			t.Errorf("archive settings without an archive dir:\n%s", conf)
		}
	})
	t.Run("RecoverySettingsNeverRendered", func(t *testing.T) {
		s := goldenSpec()
		s.RecoverySettings = map[string]string{"restore_command": "cp x %p", "recovery_target": "immediate"}
		conf, _, _ := RenderConfig(s, "root")
		if strings.Contains(conf, "restore_command") || strings.Contains(conf, "recovery_target") {
			t.Errorf("recovery settings rendered into the config file:\n%s", conf)
		}
	})
	t.Run("GuardAlwaysPreloadedLast", func(t *testing.T) {
		for from, want := range map[string]string{
			"":                                "dbcloud_guard",
			"timescaledb":                     "timescaledb,dbcloud_guard",
			"dbcloud_guard, timescaledb":      "timescaledb,dbcloud_guard",
			` timescaledb ,, "dbcloud_guard"`: "timescaledb,dbcloud_guard",
		} {
			s := goldenSpec()
			s.Settings = map[string]string{"shared_preload_libraries": from}
			conf, _, _ := RenderConfig(s, "root")
			if strings.Count(conf, "shared_preload_libraries") != 1 ||
				!strings.Contains(conf, "\nshared_preload_libraries = '"+want+"'\n") {
				t.Errorf("size preload %q: want %q once, got:\n%s", from, want, conf)
			}
		}
	})
	t.Run("TLSOnlyAEAD", func(t *testing.T) {
		s := goldenSpec()
		s.Settings = map[string]string{"ssl_ciphers": "ALL", "ssl_min_protocol_version": "TLSv1"}
		if err := validateSettings(s.Settings); err == nil {
			t.Error("a size may not weaken TLS")
		}
		conf, _, _ := RenderConfig(s, "root")
		if !strings.Contains(conf, "\nssl_min_protocol_version = 'TLSv1.2'\n") || strings.Contains(conf, "'ALL'") ||
			strings.Contains(conf, "'TLSv1'") {
			t.Errorf("TLS settings overridden:\n%s", conf)
		}
		for _, suite := range strings.Split(TLSCiphers, ":") {
			if !strings.Contains(suite, "GCM") && !strings.Contains(suite, "CHACHA20") {
				t.Errorf("suite %s is not AEAD", suite)
			}
		}
	})
	t.Run("IdentForPostgresUser", func(t *testing.T) {
		_, _, ident := RenderConfig(goldenSpec(), "postgres")
		if strings.Count(ident, "dbcloud ") != 1 || !strings.Contains(ident, "dbcloud    postgres  postgres\n") {
			t.Errorf("ident for OS user postgres:\n%s", ident)
		}
		// Only dbcloud's user is the superuser; a service's own OS user,
		// which a tenant with a shell would be, maps to its pooler and
		// replication roles only.
		s := goldenSpec()
		s.Owner = &osuser.Identity{Name: "dbc-abc", UID: 2000, GID: 2000}
		_, _, ident = RenderConfig(s, "root")
		for _, line := range strings.Split(ident, "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[1] == "dbc-abc" && f[2] != PoolerRole && f[2] != ReplicatorRole {
				t.Errorf("the service's OS user maps to %s:\n%s", f[2], ident)
			}
		}
		if !strings.Contains(ident, "dbcloud    root  postgres\n") || strings.Count(ident, "  postgres\n") != 1 ||
			!strings.Contains(ident, "dbcloud_pooler    dbc-abc  dbcloud_pooler\n") ||
			!strings.Contains(ident, "dbcloud_replicator    dbc-abc  dbcloud_replicator\n") {
			t.Errorf("ident of a service with an OS user of its own:\n%s", ident)
		}
		_, _, ident = RenderConfig(goldenSpec(), "/evil")
		if !strings.Contains(ident, `"/evil"`) {
			t.Errorf("a user name starting with / must be quoted (else it is a regexp):\n%s", ident)
		}
	})
}

func TestQuoteValue(t *testing.T) {
	for in, want := range map[string]string{
		"128MB":       `'128MB'`,
		"":            `''`,
		"it's":        `'it''s'`,
		`C:\dir`:      `'C:\\dir'`,
		"two\nlines":  `'two\nlines'`,
		`"$user", pg`: `'"$user", pg'`,
	} {
		if got := quoteValue(in); got != want {
			t.Errorf("quoteValue(%q): got %s, want %s", in, got, want)
		}
	}
}

func TestValidateSettings(t *testing.T) {
	for _, c := range []struct {
		settings map[string]string
		ok       bool
	}{
		{map[string]string{"shared_buffers": "1GB", "work_mem": "4MB"}, true},
		{map[string]string{"timescaledb.max_background_workers": "8"}, true},
		{map[string]string{"max_wal_senders": "20"}, true},
		{map[string]string{"port": "5432"}, false},
		{map[string]string{"Log_Directory": "/tmp"}, false},
		{map[string]string{"include": "/etc/passwd"}, false},
		{map[string]string{"archive_mode": "off"}, false},
		{map[string]string{"restore_command": "sh -c evil"}, false},
		{map[string]string{"work_mem = 1\nport": "1"}, false},
		{map[string]string{"work_mem": "1MB", "WORK_MEM": "2MB"}, false},
		{map[string]string{"": "x"}, false},
	} {
		if err := validateSettings(c.settings); (err == nil) != c.ok {
			t.Errorf("validateSettings(%v): got %v, want ok=%v", c.settings, err, c.ok)
		}
	}
}

// A standby that restores from the archive gets a restore_command that
// copies from it, quoted for sh; other instances get none.
func TestRenderConfig_RestoreFromArchive(t *testing.T) {
	s := goldenSpec()
	s.ArchiveDir = "/data/services/it's/archive"
	conf, _, _ := RenderConfig(s, "root")
	if strings.Contains(conf, "restore_command") {
		t.Errorf("restore_command without RestoreFromArchive:\n%s", conf)
	}
	s.RestoreFromArchive = true
	conf, _, _ = RenderConfig(s, "root")
	// sh quotes the quote as '\'', which postgresql.conf escapes again.
	want := `restore_command = 'cp ''/data/services/it''\\''''s/archive''/"%f" "%p"'`
	if !strings.Contains(conf, want) {
		t.Errorf("config lacks %s:\n%s", want, conf)
	}
}

// TestRemoveSwitchFiles: what a standby's copy keeps of a primary a
// switch sealed meanwhile is its data, not the seal or the reason.
func TestRemoveSwitchFiles(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{SealFile, EndReasonFile, "PG_VERSION"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // nothing left to remove the second time
		if err := RemoveSwitchFiles(dir); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "PG_VERSION" {
		t.Errorf("left %v, want only PG_VERSION", entries)
	}
}
