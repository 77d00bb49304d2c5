package console

import (
	"net/http"
	"strconv"

	"dbcloud"
	"dbcloud/cloud"
)

// Database credentials of a service (decisions.md section 12): its
// Credentials tab lists them, makes one (its connection string shown
// once) and revokes them.

type credentialsData struct {
	V     *cloud.ServiceView
	Creds []*cloud.CredentialView
	// TTLs are the lifetimes offered, shortest first.
	TTLs []ttlChoice
}

type ttlChoice struct {
	Seconds int64
	Label   string
}

var credentialTTLs = []ttlChoice{{3600, "1 hour"}, {8 * 3600, "8 hours"}, {24 * 3600, "1 day"}, {7 * 24 * 3600, "7 days"}, {30 * 24 * 3600, "30 days"}}

func (h *Handler) credentialsGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.credentialsPage(w, r, s, h.fromQuery(r, s))
}

func (h *Handler) credentialsPage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	h.show(w, r, s, "credentials", "Credentials", f, func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		creds, err := h.cloud.ListCredentials(r.Context(), pid, sid)
		return credentialsData{V: v, Creds: creds, TTLs: credentialTTLs}, err
	})
}

func (h *Handler) credentialCreate(w http.ResponseWriter, r *http.Request, s *session) {
	ttl, _ := strconv.ParseInt(r.PostFormValue("ttl_seconds"), 10, 64)
	nc, err := h.cloud.CreateCredential(r.Context(), r.PathValue("pid"), r.PathValue("sid"), cloud.CredentialCreate{
		Name: r.PostFormValue("name"), Access: r.PostFormValue("access"), TTLSeconds: ttl,
	})
	if err != nil {
		h.credentialsPage(w, r, s, h.failed(r, err))
		return
	}
	h.showOnce(w, r, s, "/p/"+r.PathValue("pid")+"/services/"+r.PathValue("sid")+"/credentials", flash{
		notice: "Credential " + nc.Name + " made; it expires " + nc.Expires.UTC().Format("2006-01-02 15:04 MST") + ". Its password is shown only now.",
		secret: []secret{{ID: "credential-conn", Label: "connection string", Value: nc.ConnectionString}}})
}

func (h *Handler) credentialRevoke(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	if err := h.cloud.RevokeCredential(r.Context(), pid, sid, r.PathValue("cid")); err != nil {
		h.credentialsPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/services/"+sid+"/credentials", "credrevoked")
}

// accessLabel says what a credential's access lets its holder do.
func accessLabel(a dbcloud.CredentialAccess) string {
	if a == dbcloud.CredentialReadOnly {
		return "read-only"
	}
	return "read and write"
}
