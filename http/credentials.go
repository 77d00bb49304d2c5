package http

import (
	"net/http"
	"time"

	"dbcloud"
	"dbcloud/cloud"
)

// Database credentials (beyond the document: decisions.md section 12).

type credentialCreateRequest struct {
	Name       *string `json:"name"`
	Access     string  `json:"access"`
	TTLSeconds int64   `json:"ttl_seconds"`
}

type credentialJSON struct {
	ID        string        `json:"id"`
	Name      string        `json:"name"`
	Username  string        `json:"username"`
	Access    string        `json:"access"`
	Created   time.Time     `json:"created"`
	Expires   time.Time     `json:"expires"`
	CreatedBy requesterJSON `json:"created_by"`
	// LastLogin is listed only; Password and ConnectionString are in
	// the create's answer only.
	LastLogin        *time.Time `json:"last_login,omitempty"`
	Password         string     `json:"password,omitempty"`
	ConnectionString string     `json:"connection_string,omitempty"`
}

func toCredential(c *dbcloud.Credential) credentialJSON {
	return credentialJSON{ID: c.ID, Name: c.Name, Username: c.Username(), Access: string(c.Access),
		Created: c.Created, Expires: c.Expires, CreatedBy: requesterJSON(c.CreatedBy)}
}

func (h *Handler) createCredential(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in credentialCreateRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("name", in.Name); err != nil {
		return 0, nil, err
	}
	nc, err := h.cloud.CreateCredential(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), cloud.CredentialCreate{
		Name: *in.Name, Access: in.Access, TTLSeconds: in.TTLSeconds,
	})
	if err != nil {
		return 0, nil, err
	}
	out := toCredential(nc.Credential)
	out.Password, out.ConnectionString = nc.Password, nc.ConnectionString
	return http.StatusCreated, out, nil
}

func (h *Handler) listCredentials(w http.ResponseWriter, r *http.Request) (int, any, error) {
	creds, err := h.cloud.ListCredentials(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"))
	if err != nil {
		return 0, nil, err
	}
	out := make([]credentialJSON, len(creds))
	for i, c := range creds {
		out[i] = toCredential(c.Credential)
		out[i].LastLogin = c.LastLogin
	}
	return http.StatusOK, out, nil
}

func (h *Handler) revokeCredential(w http.ResponseWriter, r *http.Request) (int, any, error) {
	err := h.cloud.RevokeCredential(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), r.PathValue("credential_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}
