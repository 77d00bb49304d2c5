package identity

import "testing"

func TestRoleTable(t *testing.T) {
	want := map[Role]map[Action]bool{
		Viewer:    {Read: true, MintReadOnly: true},
		Developer: {Read: true, MintReadOnly: true, ChangeResources: true},
		Admin:     {Read: true, MintReadOnly: true, ChangeResources: true, ManageKeys: true, ManageMembers: true},
		Owner:     {Read: true, MintReadOnly: true, ChangeResources: true, ManageKeys: true, ManageMembers: true, DeleteProject: true},
		"root":    {},
		"":        {},
	}
	for r, acts := range want {
		for _, a := range Actions {
			if got := r.Allows(a); got != acts[a] {
				t.Errorf("%q allows %s = %v, want %v", r, a, got, acts[a])
			}
		}
	}
	if !Admin.MayGrant(Developer) || Admin.MayGrant(Owner) || !Owner.MayGrant(Owner) || Developer.MayGrant(Viewer) {
		t.Error("MayGrant: admins grant below owner, owners anything, developers nothing")
	}
	if _, err := ParseRole("superuser"); err == nil {
		t.Error("ParseRole accepted an unknown role")
	}
}

func TestPassword(t *testing.T) {
	cheap := PasswordParams{Time: 1, Memory: 1024, Threads: 1}
	h, err := HashPassword("correct horse battery", cheap)
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := HashPassword("correct horse battery", cheap)
	if h == h2 {
		t.Error("two hashes of one password are equal: the salt is not random")
	}
	for pw, want := range map[string]bool{"correct horse battery": true, "correct horse batterY": false, "": false} {
		if ok, err := VerifyPassword(pw, h); err != nil || ok != want {
			t.Errorf("VerifyPassword(%q) = %v, %v; want %v", pw, ok, err, want)
		}
	}
	if _, err := VerifyPassword("x", "$2a$10$bcrypt"); err == nil {
		t.Error("a non-argon2id hash was accepted")
	}
	if CheckPassword("short") == nil || CheckPassword("long enough password") != nil {
		t.Error("CheckPassword")
	}
}
