package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"dbcloud"
	"dbcloud/pglog"
	"dbcloud/runtime/local/postgres"
)

// Database credentials (decisions.md section 12): the roles themselves,
// their access and their removal are runtime/local/postgres/credentials.go;
// this file finds the instances they live on and their last logins.

var _ dbcloud.Credentials = (*Runtime)(nil)

// SyncCredentials makes the service's credential roles exactly live, on
// its running primary:
//   - each live role is created or corrected (verifier, expiry, access),
//     writing nothing when it already is right;
//   - every other credential role is made NOLOGIN, its sessions are ended
//     on every running instance of the service (the primary, HA standbys
//     once they have replayed the NOLOGIN, the nodes of its read replica
//     sets), then what it owns passes to tsdbadmin and it is dropped;
//   - a role whose access changed has its sessions ended, so that no
//     session keeps the access it was opened with;
//   - a listed role whose expiry has passed is treated as unlisted: its
//     sessions end and it is dropped.
//
// Syncs of one service run one at a time.
//
// A service whose primary does not run gets a conflict error and no
// change: its roles are in its data directory and the next call on the
// running service applies them (an expired role cannot log in meanwhile:
// VALID UNTIL). An instance that cannot be reached, or a standby that has
// not replayed the NOLOGIN in time, leaves the stale roles undropped and
// returns the error: the next call retries.
func (rt *Runtime) SyncCredentials(ctx context.Context, svc *dbcloud.Service, live []dbcloud.CredentialRole) error {
	now := time.Now()
	var want []postgres.CredentialRole
	for _, c := range live {
		role := postgres.CredentialRole{Name: c.Username, Verifier: c.Verifier, ReadOnly: c.ReadOnly, Expires: c.Expires}
		if err := role.Validate(); err != nil {
			return dbcloud.Terminal(fmt.Errorf("service %s: %w", svc.ID, err))
		}
		// Expired is stale, even when still listed: VALID UNTIL stops
		// only new logins, and the open sessions must end too.
		if role.Expires.After(now) {
			want = append(want, role)
		}
	}
	unlock := rt.credSyncs.lock(svc.ID)
	defer unlock()
	primary, others, err := rt.credentialInstances(svc)
	if err != nil {
		return err
	}
	if _, ok := rt.instances.Running(primary); !ok {
		return dbcloud.Errorf(dbcloud.KindConflict,
			"Service %s is not running, so its database credentials cannot be changed now; they are applied when it runs again.", svc.ID)
	}
	conn, err := rt.instances.Connect(ctx, primary, "postgres")
	if err != nil {
		return fmt.Errorf("credentials of %s: %w", svc.ID, err)
	}
	change, applyErr := postgres.ApplyCredentials(ctx, conn, want)
	conn.Close(context.WithoutCancel(ctx))
	if change == nil {
		return fmt.Errorf("credentials of %s on %s: %w", svc.ID, primary.ID, applyErr)
	}
	// A live role that could not be made does not hold up the revocations.
	if err := rt.endCredentialSessions(ctx, primary, others, change); err != nil {
		return fmt.Errorf("credentials of %s: %w", svc.ID, errors.Join(applyErr, err))
	}
	if err := rt.instances.DropCredentials(ctx, primary, change.Stale); err != nil {
		return fmt.Errorf("credentials of %s: %w", svc.ID, errors.Join(applyErr, err))
	}
	if len(change.Stale) > 0 || len(change.Reshaped) > 0 {
		rt.cfg.Logger.Info("credential roles synced", "service", svc.ID, "live", len(live),
			"dropped", change.Stale, "access_changed", change.Reshaped)
	}
	if applyErr != nil {
		return fmt.Errorf("credentials of %s on %s: %w", svc.ID, primary.ID, applyErr)
	}
	return nil
}

// dropInheritedCredentials drops the credential roles a fork's data
// brought from its parent (a fork does not inherit credentials), on its
// first start, while no client can log in to it yet: the domain's sync of
// the fork comes only once the fork is open.
func (rt *Runtime) dropInheritedCredentials(ctx context.Context, spec postgres.Spec) error {
	conn, err := rt.instances.Connect(ctx, spec, "postgres")
	if err != nil {
		return fmt.Errorf("inherited credentials on %s: %w", spec.ID, err)
	}
	change, err := postgres.ApplyCredentials(ctx, conn, nil)
	conn.Close(context.WithoutCancel(ctx))
	if change == nil {
		return fmt.Errorf("inherited credentials on %s: %w", spec.ID, err)
	}
	return rt.instances.DropCredentials(ctx, spec, change.Stale)
}

// endCredentialSessions ends the sessions of the stale and reshaped roles
// on every running instance: the other instances first (each once it has
// replayed the NOLOGIN), then the primary.
func (rt *Runtime) endCredentialSessions(ctx context.Context, primary postgres.Spec, others []postgres.Spec, change *postgres.CredentialChange) error {
	names := append(append([]string(nil), change.Stale...), change.Reshaped...)
	if len(names) == 0 {
		return nil
	}
	var errs []error
	for _, s := range others {
		if _, ok := rt.instances.Running(s); !ok {
			continue // no sessions; once started it has replayed the drop
		}
		errs = append(errs, rt.instances.EndCredentialSessions(ctx, s, names, change.LSN))
	}
	errs = append(errs, rt.instances.EndCredentialSessions(ctx, primary, names, ""))
	return errors.Join(errs...)
}

// credentialInstances returns the service's current primary and every
// other instance a credential may have a session on: its HA standbys and
// the nodes of its read replica sets (found by their upstream, which is
// always one of the service's instances).
func (rt *Runtime) credentialInstances(svc *dbcloud.Service) (postgres.Spec, []postgres.Spec, error) {
	base, err := rt.instanceBase(svc)
	if err != nil {
		return postgres.Spec{}, nil, err
	}
	primary := base
	var others []postgres.Spec
	st, err := rt.loadHA(svc.ID)
	if err != nil {
		return postgres.Spec{}, nil, err
	}
	if st != nil {
		primary = rt.haSpec(svc, base, st, st.Primary)
		for _, n := range st.Members {
			if n != st.Primary {
				others = append(others, rt.haSpec(svc, base, st, n))
			}
		}
	}
	nodes, err := rt.replicaSetNodesOf(svc.ID)
	if err != nil {
		return postgres.Spec{}, nil, err
	}
	return primary, append(others, nodes...), nil
}

// replicaSetNodesOf returns the nodes of the read replica sets that follow
// one of the service's instances, as specs good for connecting.
func (rt *Runtime) replicaSetNodesOf(serviceID string) ([]postgres.Spec, error) {
	dir := filepath.Join(rt.cfg.DataDir, "services")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("replica sets of %s: %w", serviceID, err)
	}
	var out []postgres.Spec
	for _, e := range entries {
		if !e.IsDir() || e.Name() == serviceID {
			continue
		}
		st, err := rt.loadReplicaSet(e.Name())
		if err != nil || st == nil || !followsService(st.Upstream, serviceID) {
			continue
		}
		for n, port := range st.Ports {
			out = append(out, postgres.Spec{
				ID: e.Name() + "-" + strconv.Itoa(n), Dir: filepath.Join(rt.serviceDir(e.Name()), strconv.Itoa(n)), Port: port,
			})
		}
	}
	return out, nil
}

// followsService reports whether upstreamKey names an instance of the
// service: "<serviceID>-<n>@<port>".
func followsService(upstream, serviceID string) bool {
	id, _, ok := strings.Cut(upstream, "@")
	if !ok {
		return false
	}
	n, ok := strings.CutPrefix(id, serviceID+"-")
	_, err := strconv.Atoi(n)
	return ok && err == nil
}

// keyedMutex serializes work per key: two syncs of one service (the
// service layer's and the engine's round) would race to create the same
// role, and the loser's error would only be retried.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedLock
}

type keyedLock struct {
	sync.Mutex
	users int
}

// lock locks key and returns its unlock; a key nobody holds is forgotten.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyedLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyedLock{}
		k.locks[key] = l
	}
	l.users++
	k.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

// credentialLogins remembers, per service, the last login of each
// credential role and up to when its logs were read, so that each call
// reads only what was written since the previous one.
type credentialLogins struct {
	mu   sync.Mutex
	seen map[string]*loginScan
}

// forget drops a deleted service's scan: its roles are gone with it, and
// a runtime that outlives thousands of short-lived services (a fork per
// branch) must not keep a map entry for each.
func (l *credentialLogins) forget(serviceID string) {
	l.mu.Lock()
	delete(l.seen, serviceID)
	l.mu.Unlock()
}

type loginScan struct {
	last  map[string]time.Time
	until time.Time
}

// loginLookback bounds the first read of a service's logs: no credential
// lives longer than 30 days (decisions.md section 12), so an older login
// is of a credential already gone.
const loginLookback = 31 * 24 * time.Hour

// credentialLogin starts the line the guard logs for every login of a
// credential role (CREDENTIAL_LOGIN in extensions/dbcloud_guard).
const credentialLogin = "credential login: user="

// CredentialLogins reports the last login of each credential role, from
// the lines the guard logs at each of their logins on the service's
// instances and its read replica sets' nodes. A line counts only when the session that
// wrote it is the role it names, so no session forges another's login
// with RAISE. Through the pooler, a login is PgBouncer's server
// connection: the pooler reuses it for later clients. It reads files
// only, so it works on a paused service too.
func (rt *Runtime) CredentialLogins(ctx context.Context, svc *dbcloud.Service) (map[string]time.Time, error) {
	key, err := rt.logCursorKey()
	if err != nil {
		return nil, fmt.Errorf("credential logins of %s: %w", svc.ID, err)
	}
	groups, err := rt.loginSources(svc.ID)
	if err != nil {
		return nil, fmt.Errorf("credential logins of %s: %w", svc.ID, err)
	}
	rt.credLogins.mu.Lock()
	defer rt.credLogins.mu.Unlock()
	if rt.credLogins.seen == nil {
		rt.credLogins.seen = map[string]*loginScan{}
	}
	scan := rt.credLogins.seen[svc.ID]
	if scan == nil {
		scan = &loginScan{last: map[string]time.Time{}, until: time.Now().Add(-loginLookback)}
	}
	now := time.Now()
	// The collector writes lines up to pglog.Slack out of order: the next
	// read starts that much before this one's start.
	since := scan.until.Add(-pglog.Slack)
	reader := &pglog.Reader{Key: key}
	for scope, sources := range groups {
		if err := readLogins(ctx, reader, scope, sources, since, scan.last); err != nil {
			return nil, fmt.Errorf("credential logins of %s: %w", svc.ID, err)
		}
	}
	scan.until = now
	rt.credLogins.seen[svc.ID] = scan
	out := make(map[string]time.Time, len(scan.last))
	for k, v := range scan.last {
		out[k] = v
	}
	return out, nil
}

// loginSources groups the log directories to read by what owns them: the
// service's instances, and each of its read replica sets' nodes.
func (rt *Runtime) loginSources(serviceID string) (map[string][]pglog.Source, error) {
	own, err := rt.logSources(serviceID, nil)
	if err != nil {
		return nil, err
	}
	groups := map[string][]pglog.Source{serviceID: own}
	nodes, err := rt.replicaSetNodesOf(serviceID)
	if err != nil {
		return nil, err
	}
	for _, s := range nodes {
		i := strings.LastIndex(s.ID, "-")
		num, _ := strconv.Atoi(s.ID[i+1:])
		groups[s.ID[:i]] = append(groups[s.ID[:i]], pglog.Source{Node: num, Dir: s.LogDir()})
	}
	return groups, nil
}

// readLogins records into last the newest login of each credential role
// in sources since since.
func readLogins(ctx context.Context, r *pglog.Reader, scope string, sources []pglog.Source, since time.Time, last map[string]time.Time) error {
	q := pglog.Query{Scope: "credential-logins/" + scope, Since: &since, Severities: []string{"LOG"},
		Search: []string{credentialLogin + postgres.CredentialPrefix}}
	for {
		page, err := r.Read(ctx, sources, q)
		if err != nil {
			return err
		}
		for _, e := range page.Entries {
			role, ok := loginRole(e)
			if ok && e.Timestamp.After(last[role]) {
				last[role] = e.Timestamp
			}
		}
		if page.Cursor == "" {
			return nil
		}
		q.Cursor = page.Cursor
	}
}

// loginRole returns the credential role a login line is of, when the
// session that wrote it is that role.
func loginRole(e pglog.Entry) (string, bool) {
	rest, ok := strings.CutPrefix(e.Message, credentialLogin)
	if !ok {
		return "", false
	}
	role, _, _ := strings.Cut(rest, " ")
	if role != e.User || !strings.HasPrefix(role, postgres.CredentialPrefix) {
		return "", false
	}
	return role, true
}
