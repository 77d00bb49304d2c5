package console

import "net/http"

// routes adds the console's project pages.
func (h *Handler) routes() {
	h.mux.HandleFunc("GET /{$}", h.session(h.home))
}

func (h *Handler) home(w http.ResponseWriter, r *http.Request, s *session) {
	ps, err := h.cloud.ListProjects(r.Context())
	if err != nil || len(ps) == 0 {
		msg := "You are not a member of any project yet; ask a project's owner or admin to add you."
		if err != nil {
			msg = h.errorMessage(r, err)
		}
		h.render(w, r, http.StatusOK, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF, Error: msg})
		return
	}
	http.Redirect(w, r, "/p/"+ps[0].ID+"/services", http.StatusSeeOther)
}
