package console_test

import (
	"net/url"
	"strings"
	"testing"
)

// TestConsoleOwnPassword: a signed-in person changes their own password
// after giving the current one; a wrong current password, a short new one
// or two that differ are refused beside their field; afterwards the old
// password no longer signs in, the new one does, and the person's other
// sessions have ended while this one stays.
func TestConsoleOwnPassword(t *testing.T) {
	s, b, _ := signedIn(t)
	other := s.browser()
	_, page := other.get(s.srv.URL + "/signin")
	other.signIn(page, s.boot.User.Email, s.boot.Password)

	_, page = b.get(s.srv.URL + "/account")
	csrf := csrfOf(t, page)
	const next = "a new and long password"
	for _, c := range []struct {
		current, next, again, field string
	}{
		{"not-the-password", next, next, "current"},
		{s.boot.Password, "short", "short", "new"},
		{s.boot.Password, next, next + "!", "again"},
	} {
		res, page := b.post(s.srv.URL+"/account/password", url.Values{"csrf": {csrf}, "current_password": {c.current}, "new_password": {c.next}, "new_password_again": {c.again}})
		if res.StatusCode < 400 || !strings.Contains(page, `<p class="field-error" id="err-`+c.field+`">`) {
			t.Errorf("%s: %d, want an error beside the field\n%s", c.field, res.StatusCode, page)
		}
	}
	res, page := b.post(s.srv.URL+"/account/password", url.Values{"csrf": {csrf}, "current_password": {s.boot.Password}, "new_password": {next}, "new_password_again": {next}})
	if res.Request.URL.Path != "/account" || !strings.Contains(page, "Your password is changed") {
		t.Fatalf("change: %d at %s\n%s", res.StatusCode, res.Request.URL, page)
	}
	if res, _ := b.get(s.srv.URL + "/account"); res.Request.URL.Path != "/account" {
		t.Error("the session that changed the password ended")
	}
	if res, _ := other.get(s.srv.URL + "/account"); res.Request.URL.Path != "/signin" {
		t.Error("another session of the person still works after the change")
	}
	third := s.browser()
	_, page = third.get(s.srv.URL + "/signin")
	if res, _ := third.signIn(page, s.boot.User.Email, s.boot.Password); res.Request.URL.Path == "/p/"+s.boot.Project.ID+"/services" {
		t.Error("the old password still signs in")
	}
	_, page = third.get(s.srv.URL + "/signin")
	if res, _ := third.signIn(page, s.boot.User.Email, next); res.Request.URL.Path != "/p/"+s.boot.Project.ID+"/services" {
		t.Errorf("the new password does not sign in: %s", res.Request.URL)
	}
}
