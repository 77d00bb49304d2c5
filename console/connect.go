package console

import (
	"net/http"
	"strconv"

	"dbcloud"
	"dbcloud/cloud"
)

// A service's Connect tab: how psql and the common drivers reach it with
// the installation's CA and verify-full, and the CA itself to download.

// WithCA makes the console offer pem, the CA that issues every service's
// certificate, for download at /ca.pem. Called once, before serving.
func (h *Handler) WithCA(pem []byte) *Handler {
	h.caPEM = pem
	return h
}

// caFile is the name the CA is downloaded as, and the snippets read.
const caFile = "dbcloud-ca.pem"

type connectData struct {
	V *cloud.ServiceView
	// Host and Port are the endpoint's; Pooler the pooler's "host:port".
	Host, Port, Pooler string
	CAFile             string
	HasCA              bool
}

func (h *Handler) connectGet(w http.ResponseWriter, r *http.Request, s *session) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	h.show(w, r, s, "connect", "Connect", h.fromQuery(r, s), func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		d := connectData{V: v, CAFile: caFile, HasCA: len(h.caPEM) > 0}
		if ep := v.Service.Endpoint; ep != nil {
			d.Host, d.Port = ep.Host, strconv.Itoa(ep.Port)
		}
		if ep := v.Service.PoolerEndpoint; ep != nil {
			d.Pooler = hostPort(ep)
		}
		return d, nil
	})
}

func hostPort(ep *dbcloud.Endpoint) string { return ep.Host + ":" + strconv.Itoa(ep.Port) }

// caGet serves the CA certificate: public, like any CA's, so no session.
func (h *Handler) caGet(w http.ResponseWriter, r *http.Request) {
	if len(h.caPEM) == 0 {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Header().Set("Content-Disposition", `attachment; filename="`+caFile+`"`)
	w.Write(h.caPEM)
}
