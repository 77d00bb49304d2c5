package postgres

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Names of the files an instance keeps in Dir/conf. They live outside the
// data directory because pg_basebackup, copies and pg_rewind overwrite
// everything inside it, including a postgresql.conf with another port.
const (
	confFile  = "postgresql.conf"
	hbaFile   = "pg_hba.conf"
	identFile = "pg_ident.conf"
	certFile  = "server.crt"
	keyFile   = "server.key"
)

// PoolerRole is the role PgBouncer runs auth_query as. It has no password:
// pg_hba.conf lets it in only by peer identity over the unix socket, which
// only the server's OS user (PgBouncer's) can reach, and PgBouncer's own
// HBA refuses it (and the superuser) to clients.
const PoolerRole = "dbcloud_pooler"

// PoolerDatabase is the database PgBouncer runs its lookup in (auth_dbname):
// dbcloud's own, owned by the superuser, which only PoolerRole may connect
// to, so no tenant can create or change the function that vouches for its
// clients.
const PoolerDatabase = "dbcloud"

// ReplicatorRole is the role a standby streams WAL as and pg_basebackup
// and pg_rewind copy a primary as, entering by peer identity as the
// service's own OS user: REPLICATION and read access to the data directory
// through pg_rewind's functions, no superuser. Everything it can read, the
// OS user it maps from already owns.
const ReplicatorRole = "dbcloud_replicator"

// replicatorSQL makes ReplicatorRole on a primary made before it existed;
// run in the postgres database, which pg_rewind connects to (function
// grants are per database). When all is in place it writes nothing, so it
// never waits for a synchronous standby (a dead one is what a repair
// calls it for); when it does write, its commit is local only.
const replicatorSQL = `DO $$
DECLARE
  fn text;
BEGIN
  PERFORM pg_catalog.set_config('synchronous_commit', 'local', true);
  IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '` + ReplicatorRole + `') THEN
    CREATE ROLE ` + ReplicatorRole + ` LOGIN REPLICATION;
  END IF;
  FOREACH fn IN ARRAY ARRAY['pg_catalog.pg_ls_dir(text, boolean, boolean)', 'pg_catalog.pg_stat_file(text, boolean)',
      'pg_catalog.pg_read_binary_file(text)', 'pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean)'] LOOP
    IF NOT pg_catalog.has_function_privilege('` + ReplicatorRole + `', fn, 'EXECUTE') THEN
      EXECUTE 'GRANT EXECUTE ON FUNCTION ' || fn || ' TO ` + ReplicatorRole + `';
    END IF;
  END LOOP;
END$$`

// identMap is the pg_ident.conf map that lets the OS user dbcloud runs as
// log in as the superuser over the unix socket, so no superuser password
// exists anywhere.
const identMap = "dbcloud"

// GuardLibrary is the library every instance preloads
// (extensions/dbcloud_guard, built by scripts/guard.sh): it refuses what
// would let a tenant's roles out of their database and enforces
// tsdb_admin's read-only sessions (docs/security.md).
const GuardLibrary = "dbcloud_guard"

// SealFile, while it exists in an instance's data directory, has the
// guard refuse every login but the superuser's over the unix socket, with
// SQLSTATE 57P03 and a message saying the service is switching
// (extensions/dbcloud_guard/ended.c): a BLUE_GREEN switch seals the old
// server without a reload.
const SealFile = "dbcloud_sealed"

// EndReasonFile, while it exists in an instance's data directory, holds
// the reason the guard gives the sessions dbcloud ends
// (extensions/dbcloud_guard/ended.c): a BLUE_GREEN switch writes it.
const EndReasonFile = "dbcloud_end_reason"

// IsSwitchFile reports whether name, in a data directory, is one of the
// files a BLUE_GREEN switch writes there for the running server. A copy of
// the directory (a snapshot, a fork, a standby) must not take them: a
// seal copied would have the guard refuse every tenant login on the copy.
func IsSwitchFile(name string) bool { return slices.Contains(switchFiles(), name) }

func switchFiles() []string { return []string{SealFile, EndReasonFile} }

// TLSCiphers are the TLS 1.2 cipher suites instances accept: ECDHE with an
// AEAD cipher only, no CBC and no SHA-1 MACs (TLS 1.3's suites are all
// AEAD). The certificates dbcloud issues are ECDSA; the RSA suites serve a
// certificate an operator supplies.
const TLSCiphers = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:" +
	"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305"

// fixedSetting reports whether a setting is one dbcloud owns: the log
// reader, the endpoint and crash handling depend on them, so Spec.Settings
// may not change them. Names are lower case, as PostgreSQL compares them.
func fixedSetting(name string) bool {
	switch name {
	case "listen_addresses", "port", "unix_socket_directories", "cluster_name", "ssl",
		"ssl_cert_file", "ssl_key_file", "ssl_ciphers", "ssl_min_protocol_version", "password_encryption", "logging_collector", "log_destination",
		"log_directory", "log_filename", "log_rotation_age", "log_rotation_size",
		"log_truncate_on_rotation", "log_timezone", "restart_after_crash", "data_directory",
		"config_file", "hba_file", "ident_file", "external_pid_file", "include", "include_if_exists",
		"include_dir", "archive_mode", "archive_library", "archive_command",
		"basic_archive.archive_directory", "archive_timeout", "restore_command":
		return true
	}
	return false
}

// archiveTimeout forces a WAL segment switch on a quiet service, so its
// archive (and the newest point a fork can restore to) lags now by at most
// this much.
const archiveTimeout = "60s"

// defaultSettings are dbcloud's choices that a service size may override.
// initdb writes the locale and time zone into the data directory's
// postgresql.conf, which instances never read (config_file points to
// Dir/conf), so they are restated here. The replication settings are
// restart-only, so they are on from the start for later standbys and forks,
// with room for the quota's standbys (2 HA replicas and 5 read replica sets
// of 10 nodes) plus copies in progress.
func defaultSettings() map[string]string {
	return map[string]string{
		"wal_level":                  "replica",
		"max_wal_senders":            "64",
		"max_replication_slots":      "64",
		"timezone":                   "UTC",
		"datestyle":                  "iso, mdy",
		"lc_messages":                "C",
		"lc_monetary":                "C",
		"lc_numeric":                 "C",
		"lc_time":                    "C",
		"default_text_search_config": "pg_catalog.english",
	}
}

// settingName is what PostgreSQL accepts as a parameter name in a
// configuration file (GUC identifiers, including custom "ext.name" ones).
var settingName = regexp.MustCompile(`^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$`)

// validateSettings rejects settings that would break the generated file or
// override a setting dbcloud owns.
func validateSettings(settings map[string]string) error {
	seen := map[string]string{}
	for k := range settings {
		name := strings.ToLower(k)
		if !settingName.MatchString(name) {
			return fmt.Errorf("setting %q is not a valid parameter name", k)
		}
		if fixedSetting(name) {
			return fmt.Errorf("setting %q is managed by dbcloud and cannot be set", k)
		}
		if other, dup := seen[name]; dup {
			return fmt.Errorf("settings %q and %q name the same parameter", other, k)
		}
		seen[name] = k
	}
	return nil
}

// RenderConfig returns the contents of an instance's postgresql.conf,
// pg_hba.conf and pg_ident.conf. It is a pure function of the spec and of
// osUser, the OS user dbcloud runs as, which the ident map names; so equal
// specs give byte-equal files and a changed file means a changed spec.
// Settings that fail validateSettings are left out; Prepare and Reload
// report them as errors before rendering.
func RenderConfig(s Spec, osUser string) (postgresqlConf, hbaConf, identConf string) {
	// The server's OS user: the service's own, else the one every server
	// runs as when dbcloud is root, else dbcloud's.
	serverUser := osUser
	if s.Owner != nil {
		serverUser = s.Owner.Name
	} else if osUser == "root" {
		serverUser = pgOSUser
	}
	conf := filepath.Join(s.Dir, "conf")
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by dbcloud for instance %s; rewritten on every change, do not edit.\n", s.ID)
	b.WriteString("\n# Connections\n")
	writeSetting(&b, "listen_addresses", quoteValue(s.ListenAddr))
	writeSetting(&b, "port", strconv.Itoa(s.Port))
	writeSetting(&b, "unix_socket_directories", quoteValue(filepath.Join(s.Dir, "run")))
	writeSetting(&b, "cluster_name", quoteValue(s.ID))
	writeSetting(&b, "ssl", "on")
	writeSetting(&b, "ssl_cert_file", quoteValue(filepath.Join(conf, certFile)))
	writeSetting(&b, "ssl_key_file", quoteValue(filepath.Join(conf, keyFile)))
	writeSetting(&b, "ssl_min_protocol_version", quoteValue("TLSv1.2"))
	writeSetting(&b, "ssl_ciphers", quoteValue(TLSCiphers))
	writeSetting(&b, "password_encryption", quoteValue("scram-sha-256"))
	b.WriteString("\n# Logs: JSON lines outside the data directory, read by dbcloud\n")
	writeSetting(&b, "logging_collector", "on")
	writeSetting(&b, "log_destination", quoteValue("jsonlog"))
	writeSetting(&b, "log_directory", quoteValue(filepath.Join(s.Dir, "log")))
	writeSetting(&b, "log_filename", quoteValue("postgresql-%Y-%m-%d_%H%M%S.log"))
	writeSetting(&b, "log_rotation_age", "60")
	writeSetting(&b, "log_rotation_size", quoteValue("100MB"))
	writeSetting(&b, "log_truncate_on_rotation", "off")
	writeSetting(&b, "log_timezone", quoteValue("UTC"))
	b.WriteString("\n# The control plane decides what happens after a crash\n")
	writeSetting(&b, "restart_after_crash", "off")
	if s.ArchiveDir != "" {
		// basic_archive copies to a temp file, fsyncs and renames, and
		// accepts a re-archive of an identical file; a cp archive_command
		// does none of that. archive_timeout bounds how far behind now a
		// point-in-time restore can be (RPO) on a quiet service.
		b.WriteString("\n# WAL archive of the service, for snapshots and point-in-time forks\n")
		writeSetting(&b, "archive_mode", "on")
		writeSetting(&b, "archive_library", quoteValue("basic_archive"))
		writeSetting(&b, "basic_archive.archive_directory", quoteValue(s.ArchiveDir))
		writeSetting(&b, "archive_timeout", quoteValue(archiveTimeout))
		if s.RestoreFromArchive {
			// Only recovery runs it; a missing file (exit 1) sends the
			// standby back to streaming.
			writeSetting(&b, "restore_command", quoteValue(RestoreCommand(s.ArchiveDir)))
		}
	}

	settings := map[string]string{}
	for k, v := range s.Settings {
		name := strings.ToLower(k)
		if settingName.MatchString(name) && !fixedSetting(name) {
			settings[name] = v
		}
	}
	b.WriteString("\n# Tenant guard, after the libraries the service size adds\n")
	writeSetting(&b, "shared_preload_libraries", quoteValue(preloadLibraries(settings["shared_preload_libraries"])))
	delete(settings, "shared_preload_libraries")
	b.WriteString("\n# Defaults\n")
	defaults := defaultSettings()
	for _, name := range sortedKeys(defaults) {
		if _, overridden := settings[name]; !overridden {
			writeSetting(&b, name, quoteValue(defaults[name]))
		}
	}
	if len(settings) > 0 {
		b.WriteString("\n# Service size\n")
		for _, name := range sortedKeys(settings) {
			writeSetting(&b, name, quoteValue(settings[name]))
		}
	}
	return b.String(), renderHBA(s.Sealed), renderIdent(osUser, serverUser)
}

// PreloadLibraries is the shared_preload_libraries every server of an
// instance with fromSize runs with, the guard last: what a pg_upgrade run
// needs on both sides as well.
func PreloadLibraries(fromSize string) string { return preloadLibraries(fromSize) }

// preloadLibraries returns the size's shared_preload_libraries with the
// guard added. A size may add libraries but never drop the guard. The guard
// comes last so its hooks run first: a library preloaded after it (such as
// TimescaleDB, which executes some COPY and DDL itself) would otherwise
// see statements before the guard could refuse them.
func preloadLibraries(fromSize string) string {
	var libs []string
	for _, l := range strings.Split(fromSize, ",") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.EqualFold(strings.Trim(l, `"`), GuardLibrary) {
			libs = append(libs, l)
		}
	}
	return strings.Join(append(libs, GuardLibrary), ",")
}

// renderHBA allows the superuser and the pooler's lookup role only over
// the unix socket, by peer identity, the replication role likewise, no
// one else into the pooler's lookup database, the pooler's clients over
// the socket with their own SCRAM passwords, and everyone else only over
// TLS with SCRAM; plain TCP is rejected by an explicit line
// so the client is told why.
func renderHBA(sealed bool) string {
	if sealed {
		return `# Written by dbcloud; rewritten on every change, do not edit.
# Sealed: the roles' passwords are not yet this service's own.
# TYPE  DATABASE     USER      ADDRESS       METHOD
local   all          postgres                peer map=` + identMap + `
local   replication  postgres                peer map=` + identMap + `
local   all          all                     reject
host    all          all       0.0.0.0/0     reject
host    all          all       ::/0          reject
`
	}
	return `# Written by dbcloud; rewritten on every change, do not edit.
# TYPE  DATABASE     USER      ADDRESS       METHOD
local   all          postgres                peer map=` + identMap + `
local   replication  postgres                peer map=` + identMap + `
local   all          ` + PoolerRole + `          peer map=` + PoolerRole + `
local   all          ` + ReplicatorRole + `      peer map=` + ReplicatorRole + `
local   replication  ` + ReplicatorRole + `      peer map=` + ReplicatorRole + `
local   ` + PoolerDatabase + `      all                     reject
host    ` + PoolerDatabase + `      all       0.0.0.0/0     reject
host    ` + PoolerDatabase + `      all       ::/0          reject
local   all          all                     scram-sha-256
hostssl all          all       0.0.0.0/0     scram-sha-256
hostssl all          all       ::/0          scram-sha-256
hostssl replication  all       127.0.0.1/32  scram-sha-256
host    all          all       0.0.0.0/0     reject
host    all          all       ::/0          reject
`
}

// renderIdent maps only the OS user dbcloud runs as (root on a server) to
// the superuser: the server's own OS user, which a tenant who reached a
// shell through the database would be, is not in that map. The server's
// user maps to what its own processes need and nothing more: the pooler's
// lookup role (PgBouncer runs as it) and the replication role (a standby's
// walreceiver, pg_basebackup and pg_rewind run as it), which read what
// that user owns anyway.
func renderIdent(osUser, serverUser string) string {
	var b strings.Builder
	b.WriteString("# Written by dbcloud; rewritten on every change, do not edit.\n")
	b.WriteString("# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\n")
	fmt.Fprintf(&b, "%s    %s  postgres\n", identMap, identToken(osUser))
	fmt.Fprintf(&b, "%s    %s  %s\n", PoolerRole, identToken(osUser), PoolerRole)
	if serverUser != osUser {
		fmt.Fprintf(&b, "%s    %s  %s\n", PoolerRole, identToken(serverUser), PoolerRole)
	}
	fmt.Fprintf(&b, "%s    %s  %s\n", ReplicatorRole, identToken(serverUser), ReplicatorRole)
	return b.String()
}

// identToken quotes a user name that pg_ident.conf would otherwise split or
// read as a regular expression (names starting with a slash).
func identToken(name string) string {
	if name != "" && !strings.ContainsAny(name, " \t\"#,/") {
		return name
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// RestoreCommand is the restore_command that fetches WAL segments from a
// service's archive; sh runs it, so the directory is quoted for sh.
func RestoreCommand(archiveDir string) string {
	return "cp '" + strings.ReplaceAll(archiveDir, "'", `'\''`) + `'/"%f" "%p"`
}

func writeSetting(b *strings.Builder, name, value string) {
	fmt.Fprintf(b, "%s = %s\n", name, value)
}

// quoteValue makes a postgresql.conf string literal. Quoting every value is
// always valid (PostgreSQL parses numbers and booleans from strings), and
// the file lexer treats backslash as an escape, so it is doubled; a newline
// cannot appear raw inside a literal and is written as \n.
func quoteValue(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	v = strings.ReplaceAll(v, `'`, `''`)
	v = strings.ReplaceAll(v, "\n", `\n`)
	return "'" + v + "'"
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// CurrentOSUser names the OS user this process runs as, which peer
// authentication sees on the unix socket.
func CurrentOSUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return strconv.Itoa(os.Geteuid())
}
