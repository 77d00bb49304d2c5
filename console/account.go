package console

import (
	"net/http"
	"strings"
)

// The account page: one's own password, changed after giving the current
// one. Wrong guesses at the current password spend the same budget as
// failed sign-ins, so this form is no faster way to guess it.

type accountData struct {
	// Errors are the form's errors by field (current, new).
	Errors map[string]string
}

func (h *Handler) accountGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.accountPage(w, r, s, h.fromQuery(r, s), nil)
}

func (h *Handler) accountPage(w http.ResponseWriter, r *http.Request, s *session, f flash, errs map[string]string) {
	h.show(w, r, s, "account", "Your account", f, func() (any, error) { return accountData{Errors: errs}, nil })
}

func (h *Handler) passwordChange(w http.ResponseWriter, r *http.Request, s *session) {
	email, ip := s.principal.User.Email, clientIP(r)
	if wait := h.signin.blocked(email, ip); wait > 0 {
		h.accountPage(w, r, s, flash{status: http.StatusTooManyRequests, err: "Too many wrong passwords; try again in " + wait.Round(1e9).String() + "."}, nil)
		return
	}
	next := r.PostFormValue("new_password")
	if next != r.PostFormValue("new_password_again") {
		h.accountPage(w, r, s, flash{status: http.StatusBadRequest, err: "The password was not changed: see the marked field."},
			map[string]string{"again": "The two new passwords differ."})
		return
	}
	if err := h.cloud.ChangeOwnPassword(r.Context(), r.PostFormValue("current_password"), next); err != nil {
		f := h.failed(r, err)
		field, msg, ok := strings.Cut(f.err, ": ")
		if !ok || (field != "current_password" && field != "new_password") {
			h.accountPage(w, r, s, f, nil)
			return
		}
		if field == "current_password" {
			h.signin.failed(email, ip)
		}
		f.err = "The password was not changed: see the marked field."
		h.accountPage(w, r, s, f, map[string]string{strings.TrimSuffix(field, "_password"): upperFirst(msg)})
		return
	}
	redirect(w, r, "/account", "password-own")
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
