package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"dbcloud"
	apihttp "dbcloud/http"
	"dbcloud/oauth"
)

var errorsAs = errors.As

func (h *Handler) signinPage(w http.ResponseWriter, r *http.Request) {
	if s, err := h.readSession(r); err == nil && s != nil {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "signin", page{Title: "Sign in", CSRF: preCSRF(w, r), Data: signinData{Next: safeNext(r.URL.Query().Get("next"))}})
}

type signinData struct {
	Next, Email string
}

func (h *Handler) signinPost(w http.ResponseWriter, r *http.Request) {
	email, pw, next := strings.TrimSpace(r.PostFormValue("email")), r.PostFormValue("password"), safeNext(r.PostFormValue("next"))
	again := func(status int, msg string) {
		h.render(w, r, status, "signin", page{Title: "Sign in", CSRF: preCSRF(w, r), Error: msg, Data: signinData{Next: next, Email: email}})
	}
	if !checkPreCSRF(r) {
		again(http.StatusForbidden, "The form was stale (CSRF check failed); try again.")
		return
	}
	ip := clientIP(r)
	if wait := h.signin.blocked(email, ip); wait > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int(math.Ceil(wait.Seconds()))))
		again(http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins for this account or from this address; try again in %d seconds.", int(math.Ceil(wait.Seconds()))))
		return
	}
	u, err := h.cloud.SignIn(r.Context(), email, pw)
	if err != nil {
		if dbcloud.ErrorKindOf(err) == dbcloud.KindUnauthorized {
			h.signin.failed(email, ip)
		}
		again(http.StatusUnauthorized, h.errorMessage(r, err))
		return
	}
	if err := h.startSession(w, r, u.ID); err != nil {
		again(http.StatusInternalServerError, h.errorMessage(r, err))
		return
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// startSession signs the user in: a new console session in the cookie,
// and the pre-session anti-forgery cookie gone.
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request, userID string) error {
	var secret string
	err := h.cloud.Store.Update(r.Context(), func(tx dbcloud.Tx) (err error) {
		secret, err = h.cloud.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenSession, UserID: userID, CSRF: randomToken()}, SessionTTL)
		return err
	})
	if err != nil {
		return err
	}
	setCookie(w, sessionCookie, secret, SessionTTL)
	setCookie(w, preCSRFCookie, "", 0)
	return nil
}

func (h *Handler) signout(w http.ResponseWriter, r *http.Request, s *session) {
	err := h.cloud.Store.Update(r.Context(), func(tx dbcloud.Tx) error {
		return h.cloud.RevokeFamily(tx, s.principal.Token.Family)
	})
	if err != nil {
		h.render(w, r, http.StatusInternalServerError, "error", page{Error: h.errorMessage(r, err)})
		return
	}
	setCookie(w, sessionCookie, "", 0)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// signoutEverywhere ends all the user's sessions and CLI logins.
func (h *Handler) signoutEverywhere(w http.ResponseWriter, r *http.Request, s *session) {
	if err := h.cloud.SignOutEverywhere(r.Context()); err != nil {
		h.render(w, r, apihttp.StatusOf(err), "error", page{Error: h.errorMessage(r, err)})
		return
	}
	setCookie(w, sessionCookie, "", 0)
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

type authorizeData struct {
	Client string
	Params map[string]string
}

// authorizePage shows who asks for access and lets the signed-in user
// approve or deny. Nothing is issued on GET.
func (h *Handler) authorizePage(w http.ResponseWriter, r *http.Request) {
	req, err := h.oauth.CheckAuthorization(r.URL.Query())
	if err != nil {
		h.authorizeError(w, r, req, err)
		return
	}
	s, serr := h.readSession(r)
	if serr != nil {
		http.Redirect(w, r, "/signin?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	params := map[string]string{}
	for k := range r.URL.Query() {
		params[k] = r.URL.Query().Get(k)
	}
	h.render(w, r, http.StatusOK, "authorize", page{
		Title: "Approve " + req.Client.Name, User: s.principal.User, CSRF: s.principal.Token.CSRF,
		Data: authorizeData{Client: req.Client.Name, Params: params},
	})
}

func (h *Handler) authorizePost(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.PostForm
	req, err := h.oauth.CheckAuthorization(q)
	if err != nil {
		h.authorizeError(w, r, req, err)
		return
	}
	if r.PostFormValue("decision") != "approve" {
		http.Redirect(w, r, oauth.Deny(req), http.StatusSeeOther)
		return
	}
	to, err := h.oauth.Approve(r.Context(), s.principal.User.ID, req)
	if err != nil {
		h.render(w, r, http.StatusInternalServerError, "error", page{Error: h.errorMessage(r, err)})
		return
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// authorizeError sends the error back to the client when its redirect URI
// is known good, and otherwise shows it to the user: an unchecked URI must
// never receive a redirect (RFC 6749 section 4.1.2.1).
func (h *Handler) authorizeError(w http.ResponseWriter, r *http.Request, req *oauth.Request, err error) {
	var oe *oauth.Error
	if errors.As(err, &oe) && oe.Redirect && req != nil {
		http.Redirect(w, r, oauth.RedirectError(req, oe), http.StatusSeeOther)
		return
	}
	msg := err.Error()
	if oe != nil {
		msg = oe.Description
	}
	h.render(w, r, http.StatusBadRequest, "error", page{Title: "Sign-in request refused", Error: msg})
}

func (h *Handler) successPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "success", page{Title: "Signed in"})
}

// token is the token endpoint (RFC 6749 sections 3.2 and 5): a form POST,
// answered in JSON that no cache may keep.
func (h *Handler) token(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	w.Header().Set("Content-Type", "application/json")
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"error": "invalid_request", "error_description": "The body must be application/x-www-form-urlencoded."})
		return
	}
	toks, err := h.oauth.Token(r.Context(), r.PostForm)
	if err != nil {
		var oe *oauth.Error
		if !errors.As(err, &oe) {
			h.logger.Error("token endpoint", "err", err)
			w.WriteHeader(http.StatusInternalServerError)
			json.NewEncoder(w).Encode(map[string]string{"error": "server_error", "error_description": "Internal error."})
			return
		}
		status := http.StatusBadRequest
		if oe.Code == "invalid_client" {
			status = http.StatusUnauthorized
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]string{"error": oe.Code, "error_description": oe.Description})
		return
	}
	json.NewEncoder(w).Encode(toks)
}
