package console

import (
	"net/http"
	"strings"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	apihttp "dbcloud/http"
	"dbcloud/identity"
)

// People: invitations by a one-time link the inviter copies, the page the
// link opens, and projects made in the console.

// newProjectChoice is the project switch's entry for making a project:
// with it the switch needs no room of its own in the header.
const newProjectChoice = "new"

func (h *Handler) peopleRoutes() {
	s := h.session
	h.mux.HandleFunc("GET /projects/new", s(h.newProjectGet))
	h.mux.HandleFunc("POST /projects", s(h.projectCreate))
	h.mux.HandleFunc("POST /p/{pid}/invitations", s(h.inviteCreate))
	h.mux.HandleFunc("POST /p/{pid}/invitations/{iid}/revoke", s(h.inviteRevoke))
	// The invitation's page works without a session: the invited person
	// may have no account yet.
	h.mux.HandleFunc("GET /invite/{token}", h.invitationGet)
	h.mux.HandleFunc("POST /invite/{token}", h.invitationAccept)
}

// Projects.

type newProjectData struct {
	// Name is what was typed; Errors the form's errors by field.
	Name   string
	Errors map[string]string
}

func (h *Handler) newProjectGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.newProjectPage(w, r, s, h.fromQuery(r, s), "", nil)
}

func (h *Handler) newProjectPage(w http.ResponseWriter, r *http.Request, s *session, f flash, name string, errs map[string]string) {
	h.show(w, r, s, "newproject", "New project", f, func() (any, error) {
		return newProjectData{Name: name, Errors: errs}, nil
	})
}

func (h *Handler) projectCreate(w http.ResponseWriter, r *http.Request, s *session) {
	name := r.PostFormValue("name")
	p, err := h.cloud.CreateOwnProject(r.Context(), name)
	if err != nil {
		f := h.failed(r, err)
		errs := map[string]string{"name": f.err}
		f.err = "The project was not created: see the marked field."
		h.newProjectPage(w, r, s, f, name, errs)
		return
	}
	redirect(w, r, "/p/"+p.ID+"/services", "project")
}

// Invitations, on the members page.

// inviteForm is the invitation form as typed, and its error.
type inviteForm struct {
	Email string
	Role  identity.Role
	Error string
}

func (h *Handler) inviteCreate(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	form := inviteForm{Email: r.PostFormValue("email"), Role: identity.Role(r.PostFormValue("role"))}
	inv, err := h.cloud.Invite(r.Context(), pid, form.Email, form.Role)
	if err != nil {
		f := h.failed(r, err)
		form.Error, f.err = f.err, "No invitation was made: see the invitation form."
		h.membersPageWith(w, r, s, f, form)
		return
	}
	link := "https://" + r.Host + "/invite/" + inv.Token
	h.showOnce(w, r, s, "/p/"+pid+"/members", flash{
		notice: "Invitation made. Copy the link and send it to " + inv.Invitation.Email + " yourself: it works once, until " +
			inv.Invitation.Expires.UTC().Format("2006-01-02 15:04 UTC") + ".",
		secret: []secret{{ID: "invite-link", Label: "invitation link", Value: link}},
	})
}

func (h *Handler) inviteRevoke(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.RevokeInvitation(r.Context(), pid, r.PathValue("iid")); err != nil {
		h.membersPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/members", "invrevoked")
}

// The invitation's page.

type invitationData struct {
	View  *cloud.InvitationView
	Token string
	// SignedIn: the visitor is signed in as the invited account.
	SignedIn bool
	// Name is what was typed; Errors the form's errors by field.
	Name   string
	Errors map[string]string
}

// invitationPage renders the link's page: the form, or, when the link no
// longer works, only why (and nothing to submit).
func (h *Handler) invitationPage(w http.ResponseWriter, r *http.Request, status int, errMsg string, d invitationData) {
	p := page{Title: "Invitation", CSRF: preCSRF(w, r), Error: errMsg, Data: d}
	if s, err := h.readSession(r); err == nil {
		p.User = s.principal.User
		d.SignedIn = d.View != nil && strings.EqualFold(s.principal.User.Email, d.View.Invitation.Email)
		p.Data = d
	}
	h.render(w, r, status, "invite", p)
}

func (h *Handler) invitationGet(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	v, err := h.cloud.OpenInvitation(r.Context(), token)
	if err != nil {
		h.invitationPage(w, r, invitationStatus(err), h.errorMessage(r, err), invitationData{})
		return
	}
	h.invitationPage(w, r, http.StatusOK, "", invitationData{View: v, Token: token})
}

// invitationStatus is the status of a link that does not work: 410 for
// one that did (used, withdrawn, expired), else the domain's.
func invitationStatus(err error) int {
	if dbcloud.ErrorKindOf(err) == dbcloud.KindConflict {
		return http.StatusGone
	}
	return apihttp.StatusOf(err)
}

func (h *Handler) invitationAccept(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if !checkPreCSRF(r) {
		h.invitationPage(w, r, http.StatusForbidden, "The form was stale (CSRF check failed); open the link again.", invitationData{})
		return
	}
	ctx := r.Context()
	prior, serr := h.readSession(r)
	if serr == nil {
		ctx = cloud.NewContextWithPrincipal(ctx, prior.principal)
	}
	name, pw := r.PostFormValue("name"), r.PostFormValue("password")
	if pw != r.PostFormValue("password_again") {
		h.invitationRetry(w, r, token, name, map[string]string{"again": "The two passwords differ."})
		return
	}
	a, err := h.cloud.AcceptInvitation(ctx, token, name, pw)
	if err != nil {
		msg := h.errorMessage(r, err)
		switch {
		case dbcloud.ErrorKindOf(err) == dbcloud.KindInvalid && strings.HasPrefix(msg, "password: "):
			h.invitationRetry(w, r, token, name, map[string]string{"password": upperFirst(strings.TrimPrefix(msg, "password: "))})
		case dbcloud.ErrorKindOf(err) == dbcloud.KindInvalid && strings.HasPrefix(msg, "name "):
			h.invitationRetry(w, r, token, name, map[string]string{"name": "The " + msg})
		default:
			h.invitationPage(w, r, invitationStatus(err), msg, invitationData{})
		}
		return
	}
	if serr != nil || prior.principal.User.ID != a.User.ID {
		if serr == nil {
			// Someone else was signed in in this browser: that session
			// ends here, as a sign-out would end it.
			if err := h.cloud.Store.Update(r.Context(), func(tx dbcloud.Tx) error {
				return h.cloud.RevokeFamily(tx, prior.principal.Token.Family)
			}); err != nil {
				h.logger.Warn("end the replaced session", "err", err)
			}
		}
		if err := h.startSession(w, r, a.User.ID); err != nil {
			// The person is a member already; only the sign-in failed.
			h.render(w, r, http.StatusInternalServerError, "error", page{Error: h.errorMessage(r, err) + " You are a member now: sign in."})
			return
		}
	}
	redirect(w, r, "/p/"+a.ProjectID+"/services", "joined")
}

// invitationRetry shows the form again, with the name typed and the
// errors beside their fields, if the link still works.
func (h *Handler) invitationRetry(w http.ResponseWriter, r *http.Request, token, name string, errs map[string]string) {
	v, err := h.cloud.OpenInvitation(r.Context(), token)
	if err != nil {
		h.invitationPage(w, r, invitationStatus(err), h.errorMessage(r, err), invitationData{})
		return
	}
	h.invitationPage(w, r, http.StatusBadRequest, "You have not joined yet: see the marked field.",
		invitationData{View: v, Token: token, Name: name, Errors: errs})
}

// lastUsed shows a key's last use, or that it has none.
func lastUsed(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}
