package osuser

import (
	"context"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeDB is a user database in memory, with the exit codes of the real
// tools, so the manager's logic is tested without root.
type fakeDB struct {
	mu      sync.Mutex
	users   map[string]int
	next    int
	busy    int // how many more calls fail as if the lock were held
	calls   []string
	rootUID bool
}

func (f *fakeDB) tools() Tools {
	return Tools{
		Run: func(_ context.Context, name string, args ...string) (int, string, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.calls = append(f.calls, name+" "+strings.Join(args, " "))
			if f.busy > 0 {
				f.busy--
				return 10, "cannot lock /etc/passwd; try again later.", nil
			}
			u := args[len(args)-1]
			switch name {
			case "useradd":
				if _, ok := f.users[u]; ok {
					return 9, "user already exists", nil
				}
				f.next++
				f.users[u] = f.next
			case "userdel":
				if _, ok := f.users[u]; !ok {
					return 6, "user does not exist", nil
				}
				delete(f.users, u)
			case "groupdel":
				return 6, "group does not exist", nil
			}
			return 0, "", nil
		},
		Lookup: func(name string) (*user.User, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			id, ok := f.users[name]
			if !ok {
				return nil, user.UnknownUserError(name)
			}
			if f.rootUID {
				id = 0
			}
			s := strconv.Itoa(id)
			return &user.User{Username: name, Uid: s, Gid: s}, nil
		},
	}
}

func TestEnsureLookupRemove(t *testing.T) {
	db := &fakeDB{users: map[string]int{}, next: 2000, busy: 2}
	m := New(DefaultPrefix, db.tools(), nil)
	ctx := context.Background()

	if _, ok, err := m.Lookup("abc"); err != nil || ok {
		t.Fatalf("Lookup before Ensure = %v, %v; want not found", ok, err)
	}
	a, err := m.Ensure(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "dbc-abc" || a.UID != 2001 || a.GID != 2001 {
		t.Fatalf("identity %+v", a)
	}
	if c := a.Credential(); c.Uid != 2001 || c.Gid != 2001 || c.Groups == nil || len(c.Groups) != 0 {
		t.Fatalf("credential %+v: want the identity's uid and gid and an empty group list", c)
	}
	// Idempotent, and a second service gets another uid.
	if again, err := m.Ensure(ctx, "abc"); err != nil || again != a {
		t.Fatalf("second Ensure = %+v, %v", again, err)
	}
	b, err := m.Ensure(ctx, "def")
	if err != nil || b.UID == a.UID {
		t.Fatalf("second service %+v, %v: want a uid of its own", b, err)
	}
	useradds := 0
	for _, c := range db.calls {
		if strings.HasPrefix(c, "useradd ") {
			useradds++
			for _, want := range []string{"--no-create-home", "--shell /usr/sbin/nologin", "--user-group"} {
				if !strings.Contains(c, want) {
					t.Errorf("%q lacks %s", c, want)
				}
			}
		}
	}
	if useradds != 4 { // two busy, then one per service
		t.Errorf("%d useradd calls, want 4 (two retried while the database was locked): %q", useradds, db.calls)
	}

	if err := m.Remove(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := m.Lookup("abc"); err != nil || ok {
		t.Fatalf("Lookup after Remove = %v, %v", ok, err)
	}
	if err := m.Remove(ctx, "abc"); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestRefusesRootAndBadNames(t *testing.T) {
	db := &fakeDB{users: map[string]int{"dbc-x": 5}, rootUID: true}
	m := New(DefaultPrefix, db.tools(), nil)
	if _, _, err := m.Lookup("x"); err == nil {
		t.Fatal("an identity with uid 0 was accepted")
	}
	m = New(DefaultPrefix, (&fakeDB{users: map[string]int{}}).tools(), nil)
	if _, err := m.Ensure(context.Background(), "Bad Name"); err == nil {
		t.Fatal("a name useradd would refuse was passed on")
	}
}

// TestSystem makes and removes a real identity: what a host running
// dbcloud must allow (Check).
func TestSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	m := New(DefaultPrefix, SystemTools(), nil)
	ctx := context.Background()
	if err := m.Check(ctx); err != nil {
		t.Fatal(err)
	}
	key := "test-" + strconv.Itoa(os.Getpid())
	id, err := m.Ensure(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Remove(ctx, key) })
	u, err := user.Lookup(id.Name)
	if err != nil || u.Uid != strconv.Itoa(int(id.UID)) {
		t.Fatalf("lookup %s = %+v, %v", id.Name, u, err)
	}
	g, err := user.LookupGroupId(strconv.Itoa(int(id.GID)))
	if err != nil || g.Name != id.Name {
		t.Fatalf("group of %s = %+v, %v: want a group of its own", id.Name, g, err)
	}
	if u.HomeDir != "/nonexistent" {
		t.Errorf("home %q", u.HomeDir)
	}
	if _, err := os.Stat(u.HomeDir); !os.IsNotExist(err) {
		t.Errorf("home directory %s exists: %v", u.HomeDir, err)
	}
	if err := m.Remove(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := user.Lookup(id.Name); err == nil {
		t.Fatal("user still exists after Remove")
	}
	if _, err := user.LookupGroup(id.Name); err == nil {
		t.Fatal("group still exists after Remove")
	}
}

// A host that refuses to make users (a read-only /etc, no useradd) fails
// Check with a sentence saying so, which dbcloud prints at start.
func TestCheckFailsClearly(t *testing.T) {
	tools := Tools{
		Run: func(context.Context, string, ...string) (int, string, error) {
			return 1, "useradd: cannot lock /etc/passwd; try again later.", nil
		},
		Lookup: func(name string) (*user.User, error) { return nil, user.UnknownUserError(name) },
	}
	err := New(DefaultPrefix, tools, nil).Check(context.Background())
	if err == nil {
		t.Fatal("Check passed on a host that makes no users")
	}
	want := "needs root"
	if os.Geteuid() == 0 {
		want = "does not let it create one"
	}
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "OS user of its own") {
		t.Errorf("Check: %v; want a sentence containing %q", err, want)
	}
}
