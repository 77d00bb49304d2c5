// Package osuser gives each service an OS identity of its own: a user and
// a group that only that service's processes run as and only its files
// belong to. A tenant who gets a shell through its database (COPY ...
// PROGRAM, say) is then that user, and the kernel keeps it out of every
// other service's files, sockets and processes.
//
// Identities are made with the system's own tools (useradd, userdel), so
// /etc/passwd, /etc/shadow and /etc/group stay consistent and locked the
// way every other tool expects. The users have no shell, no home and no
// password: nothing logs in as them, dbcloud only runs processes with their
// credentials.
package osuser

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Identity is an OS user and its own group.
type Identity struct {
	Name     string
	UID, GID uint32
}

// Credential is what a process spawned as the identity runs with: its uid
// and gid and no supplementary groups.
func (id Identity) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}
}

// DefaultPrefix starts the name of every identity dbcloud makes.
const DefaultPrefix = "dbc-"

// nameOK is what useradd accepts everywhere (Debian's and shadow's
// defaults) within the 32 bytes of utmp.
var nameOK = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// Tools are the commands that change the user database; a unit test
// replaces them.
type Tools struct {
	// Run runs one of useradd, userdel, groupdel with args and returns its
	// exit code (0 for success) and output.
	Run func(ctx context.Context, name string, args ...string) (int, string, error)
	// Lookup finds a user by name; user.UnknownUserError when there is none.
	Lookup func(name string) (*user.User, error)
}

// SystemTools runs the real commands and reads the real user database.
func SystemTools() Tools {
	return Tools{
		Run: func(ctx context.Context, name string, args ...string) (int, string, error) {
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode(), strings.TrimSpace(string(out)), nil
			}
			return 0, strings.TrimSpace(string(out)), err
		},
		Lookup: user.Lookup,
	}
}

// Manager makes, finds and removes the identities of services, named
// prefix+key (key is the service's ID).
type Manager struct {
	prefix string
	tools  Tools
	logger *slog.Logger

	// mu serializes changes to the user database from this process:
	// useradd takes a lock file and fails rather than waits when it is
	// held.
	mu    sync.Mutex
	cache map[string]Identity
}

// New returns a manager of identities named prefix+key.
func New(prefix string, tools Tools, logger *slog.Logger) *Manager {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{prefix: prefix, tools: tools, logger: logger, cache: map[string]Identity{}}
}

// Name is the OS user name of key's identity.
func (m *Manager) Name(key string) string { return m.prefix + key }

// Check proves that this host lets dbcloud make identities, by making and
// removing one: a host that does not (dbcloud not root, no useradd, a
// read-only /etc) must fail at start with the reason, not with a half-made
// service later.
func (m *Manager) Check(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("dbcloud runs every service as an OS user of its own and creates those users, which needs root; run dbcloud as root")
	}
	key := "probe-" + strconv.Itoa(os.Getpid())
	if _, err := m.Ensure(ctx, key); err != nil {
		return fmt.Errorf("dbcloud runs every service as an OS user of its own, but this host does not let it create one: %w", err)
	}
	if err := m.Remove(ctx, key); err != nil {
		return fmt.Errorf("dbcloud runs every service as an OS user of its own, but this host does not let it remove one: %w", err)
	}
	return nil
}

// Lookup returns key's identity if it exists.
func (m *Manager) Lookup(key string) (Identity, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lookup(key)
}

func (m *Manager) lookup(key string) (Identity, bool, error) {
	if id, ok := m.cache[key]; ok {
		return id, true, nil
	}
	name := m.Name(key)
	u, err := m.tools.Lookup(name)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		return Identity{}, false, nil
	} else if err != nil {
		return Identity{}, false, fmt.Errorf("look up OS user %s: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return Identity{}, false, fmt.Errorf("OS user %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return Identity{}, false, fmt.Errorf("OS user %s: gid %q: %w", name, u.Gid, err)
	}
	if uid == 0 || gid == 0 {
		// Never hand out root's powers, whatever the database says.
		return Identity{}, false, fmt.Errorf("OS user %s has uid %d gid %d; refusing an identity of root", name, uid, gid)
	}
	id := Identity{Name: name, UID: uint32(uid), GID: uint32(gid)}
	m.cache[key] = id
	return id, true, nil
}

// Ensure returns key's identity, making it first if it does not exist:
// a user with a group of its own, no home, no shell, no password.
func (m *Manager) Ensure(ctx context.Context, key string) (Identity, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok, err := m.lookup(key); err != nil || ok {
		return id, err
	}
	name := m.Name(key)
	if !nameOK.MatchString(name) {
		return Identity{}, fmt.Errorf("%q cannot name an OS user", name)
	}
	begin := time.Now()
	err := m.retry(ctx, "useradd", []int{0, 9}, // 9: exists (made concurrently)
		"--user-group", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--comment", "dbcloud service "+key, name)
	if err != nil {
		return Identity{}, err
	}
	id, ok, err := m.lookup(key)
	if err != nil {
		return Identity{}, err
	}
	if !ok {
		return Identity{}, fmt.Errorf("useradd %s succeeded but the user does not exist", name)
	}
	m.logger.Info("OS user created", "user", name, "uid", id.UID, "gid", id.GID, "ms", time.Since(begin).Milliseconds())
	return id, nil
}

// Remove deletes key's user and group; it is idempotent. Every process of
// the identity must have exited (userdel refuses otherwise, and retrying
// covers one still exiting).
func (m *Manager) Remove(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	name := m.Name(key)
	delete(m.cache, key)
	// 6: no such user. userdel removes the user's own group with it.
	if err := m.retry(ctx, "userdel", []int{0, 6}, name); err != nil {
		return err
	}
	// A group left behind (USERGROUPS_ENAB off, or a crash in between).
	if err := m.retry(ctx, "groupdel", []int{0, 6}, name); err != nil {
		return err
	}
	m.logger.Info("OS user removed", "user", name)
	return nil
}

// retry runs a user database tool until it exits with one of ok, retrying
// the failures that mean "busy": the database's lock held by another tool
// (exit 10 for useradd, userdel and groupdel) or a process of the user
// still exiting (userdel's 8).
func (m *Manager) retry(ctx context.Context, tool string, ok []int, args ...string) error {
	deadline := time.Now().Add(20 * time.Second)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		code, out, err := m.tools.Run(ctx, tool, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", tool, err)
		}
		for _, c := range ok {
			if code == c {
				return nil
			}
		}
		if (code != 10 && code != 8) || time.Now().After(deadline) {
			return fmt.Errorf("%s %s: exit %d: %s", tool, strings.Join(args, " "), code, out)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}
