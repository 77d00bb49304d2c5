package pgbouncer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"dbcloud/runtime/local/postgres"
)

// poolSize is how many server connections the pooler may open per pool
// (and per database and per user): three quarters of what max_connections
// leaves beyond the superuser's reserve, so direct clients on the service
// endpoint and maintenance keep room.
func poolSize(settings map[string]string) int {
	maxConns := 100
	if v, err := strconv.Atoi(settings["max_connections"]); err == nil && v > 0 {
		maxConns = v
	}
	return max(1, (maxConns-superuserReserved)*3/4)
}

// renderPoolerConfig returns pgbouncer.ini and PgBouncer's HBA file. It is
// a pure function of the spec, so an unchanged spec leaves the files
// byte-equal and PgBouncer untouched. The first line signs what only a
// restart applies (listen address and port, pid file, TLS key pair).
func renderPoolerConfig(p Spec) (ini, hba []byte) {
	size := poolSize(p.Target.Settings)
	var b bytes.Buffer
	fmt.Fprintf(&b, "; restart signature: %s\n", poolerRestartSignature(p))
	fmt.Fprintf(&b, "; Written by dbcloud for pooler %s; rewritten on every change, do not edit.\n", p.ID)
	b.WriteString("[databases]\n")
	// Every database of the service, over the instance's unix socket. The
	// lookup role is set here, not globally, so that the admin console
	// (which has no server to ask) refuses at once instead of hanging. The
	// lookup database is named too, so the lookup never depends on an
	// automatic entry.
	for _, db := range []string{"*", postgres.PoolerDatabase} {
		fmt.Fprintf(&b, "%s = host=%s port=%d auth_user=%s\n", db, p.Target.RunDir(), p.Target.Port, postgres.PoolerRole)
	}
	b.WriteString("\n[pgbouncer]\n")
	set := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, v) }
	set("listen_addr", p.ListenAddr)
	set("listen_port", strconv.Itoa(p.Port))
	set("listen_backlog", "1024")
	set("unix_socket_dir", "") // no client socket: TCP with TLS only
	set("pidfile", p.path(poolerPidFile))
	set("pool_mode", "transaction")
	set("max_client_conn", strconv.Itoa(poolerMaxClientConn))
	set("default_pool_size", strconv.Itoa(size))
	set("max_db_connections", strconv.Itoa(size))
	set("max_user_connections", strconv.Itoa(size))
	set("reserve_pool_size", "0")
	set("auth_type", "hba")
	set("auth_hba_file", p.path(poolerHBAFile))
	set("auth_file", p.path(poolerUsersFile))
	// The lookup runs in dbcloud's database, whatever database the client
	// names: a tenant can create a database, and a schema pgbouncer in it.
	set("auth_dbname", postgres.PoolerDatabase)
	set("auth_query", "SELECT usename, passwd FROM pgbouncer.get_auth($1)")
	set("client_tls_sslmode", "require")
	set("client_tls_cert_file", p.path(poolerCertFile))
	set("client_tls_key_file", p.path(poolerKeyFile))
	set("client_tls_protocols", "secure") // TLS 1.2 and 1.3
	// The instance's own suites: ECDHE with AEAD only, no CBC or SHA-1.
	set("client_tls_ciphers", postgres.TLSCiphers)
	set("server_tls_sslmode", "disable") // unix socket
	// A failed server login (the primary restarting) refuses new clients
	// for this long; the default 15 s outlasts a restart by far.
	set("server_login_retry", "1")
	set("ignore_startup_parameters", "extra_float_digits")
	set("log_connections", "0")
	set("log_disconnections", "0")
	set("log_stats", "0")
	set("admin_users", "")
	set("stats_users", "")

	// Tenant roles only. dbcloud's roles log in to PostgreSQL by peer
	// identity over the socket, which PgBouncer's OS user passes: no client
	// may ever make PgBouncer open such a connection. They are refused here
	// by name, and the lookup function refuses every reserved name (in any
	// case, with spaces around) on top. Neither may anyone reach the admin
	// console, the lookup's database or a replication connection.
	var h bytes.Buffer
	h.WriteString("# Written by dbcloud; rewritten on every change, do not edit.\n")
	for _, cidr := range []string{"0.0.0.0/0", "::/0"} {
		fmt.Fprintf(&h, "hostssl  pgbouncer,%s  all  %s  reject\n", postgres.PoolerDatabase, cidr)
		fmt.Fprintf(&h, "hostssl  replication  all  %s  reject\n", cidr)
		fmt.Fprintf(&h, "hostssl  all  %s  %s  reject\n", platformRoles, cidr)
	}
	for _, cidr := range []string{"0.0.0.0/0", "::/0"} {
		fmt.Fprintf(&h, "hostssl  all  all  %s  scram-sha-256\n", cidr)
	}
	return b.Bytes(), h.Bytes()
}

// platformRoles are the roles of the platform that can log in, all by
// peer identity: the superuser, the pooler's lookup role and the
// replication role.
const platformRoles = "postgres," + postgres.PoolerRole + "," + postgres.ReplicatorRole

// poolerRestartSignature hashes what PgBouncer reads only at startup, and
// the binary that runs it: a new PgBouncer restarts the pooler.
func poolerRestartSignature(p Spec) string {
	h := sha256.New()
	for _, v := range []string{p.binary, p.ListenAddr, strconv.Itoa(p.Port), p.path(poolerPidFile),
		strconv.Itoa(poolerNoFile), string(p.Target.CertPEM), string(p.Target.KeyPEM)} {
		fmt.Fprintf(h, "%d:%s;", len(v), v)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func restartSignature(ini []byte) string {
	first, _, _ := bytes.Cut(ini, []byte("\n"))
	sig, ok := bytes.CutPrefix(first, []byte("; restart signature: "))
	if !ok {
		return ""
	}
	return string(sig)
}
