package console

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"dbcloud/cloud"

	"dbcloud"
)

// The services list: search, each service's endpoint, and the create
// form, which explains the sizes and, when the domain refuses it, shows
// the domain's message beside the field it is about with what was typed.

type servicesData struct {
	Services []*cloud.ServiceView
	// Search is the list's filter (a part of a name or ID); Total how
	// many services the project has.
	Search      string
	Total       int
	Sizes       []sizeRow
	Regions     []string
	MaxReplicas int
	Form        createForm
}

// createForm is the create form's values and its errors by field.
type createForm struct {
	Name, Size, Environment, Region string
	Replicas                        int
	Addons                          map[string]bool
	Errors                          map[string]string
}

// sizeRow is a size in the create form's table.
type sizeRow struct {
	Value, CPU, Memory string
	// Units is what the size costs compared with the smallest dedicated
	// one (500 millicores, 2 GB): the installation charges nothing, but
	// this is how the original's prices scale.
	Units string
}

// baseSize is the size Units counts in.
var baseSize = dbcloud.DefaultSize

func (h *Handler) sizes() []string {
	var out []string
	for _, sz := range h.cloud.Config.Sizes {
		out = append(out, sz.String())
	}
	return out
}

func (h *Handler) sizeRows() []sizeRow {
	var out []sizeRow
	for _, sz := range h.cloud.Config.Sizes {
		if sz.Shared {
			out = append(out, sizeRow{Value: sz.String(), CPU: "a share of the host", Memory: "a share of the host", Units: "less than 1"})
			continue
		}
		out = append(out, sizeRow{Value: sz.String(), CPU: strconv.FormatFloat(float64(sz.CPUMillis)/1000, 'f', -1, 64) + " vCPU",
			Memory: strconv.Itoa(sz.MemoryGBs) + " GB", Units: fmt.Sprintf("%g", float64(sz.CPUMillis)/float64(baseSize.CPUMillis))})
	}
	return out
}

func (h *Handler) servicesGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.servicesPage(w, r, s, h.fromQuery(r, s), createForm{Size: baseSize.String(), Environment: "DEV"})
}

func (h *Handler) servicesPage(w http.ResponseWriter, r *http.Request, s *session, f flash, form createForm) {
	h.show(w, r, s, "services", "Services", f, func() (any, error) {
		vs, err := h.cloud.ListServices(r.Context(), r.PathValue("pid"))
		if err != nil {
			return nil, err
		}
		d := servicesData{Search: strings.TrimSpace(r.URL.Query().Get("q")), Total: len(vs), Sizes: h.sizeRows(),
			Regions: h.cloud.Config.Regions, MaxReplicas: h.cloud.Config.Quotas.MaxHAReplicas, Form: form}
		d.Services = matching(vs, d.Search)
		return d, nil
	})
}

// matching keeps the services whose name or ID holds q, ignoring case.
func matching(vs []*cloud.ServiceView, q string) []*cloud.ServiceView {
	if q == "" {
		return vs
	}
	q = strings.ToLower(q)
	var out []*cloud.ServiceView
	for _, v := range vs {
		if strings.Contains(strings.ToLower(v.Service.Name), q) || strings.Contains(v.Service.ID, q) {
			out = append(out, v)
		}
	}
	return out
}

// splitSize reads the size select's value, "CPU/MEMORY" as the API takes
// them ("shared/shared" or "500/2").
func splitSize(v string) (cpu, mem string) {
	cpu, mem, _ = strings.Cut(v, "/")
	return cpu, mem
}

func (h *Handler) serviceCreate(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	form := createForm{Name: r.PostFormValue("name"), Size: r.PostFormValue("size"), Environment: r.PostFormValue("environment"),
		Region: r.PostFormValue("region"), Addons: map[string]bool{}}
	for _, a := range r.PostForm["addons"] {
		form.Addons[a] = true
	}
	cpu, mem := splitSize(form.Size)
	in := cloud.ServiceCreate{Name: form.Name, CPUMillis: cpu, MemoryGBs: mem, Environment: form.Environment, Region: form.Region, Addons: r.PostForm["addons"]}
	var err error
	if v := r.PostFormValue("replicas"); v != "" {
		if form.Replicas, err = strconv.Atoi(v); err != nil {
			err = dbcloud.Errorf(dbcloud.KindInvalid, "replica_count must be a whole number, got %q.", v)
		}
		in.Replicas = &form.Replicas
	}
	var v *cloud.ServiceView
	if err == nil {
		v, err = h.cloud.CreateService(r.Context(), pid, in)
	}
	if err != nil {
		f := h.failed(r, err)
		if field := fieldOf(f.err); field != "" {
			form.Errors = map[string]string{field: f.err}
			f.err = "The service was not created: see the marked field."
		}
		h.servicesPage(w, r, s, f, form)
		return
	}
	// The password exists only in this answer: shown once, by the page.
	h.showOnce(w, r, s, "/p/"+pid+"/services/"+v.Service.ID, flash{notice: "Service created; it becomes READY in a moment.",
		secret: passwordSecrets(v.InitialPassword, connString(v.Service.Endpoint, v.InitialPassword))})
}

// createFields map the API's field names, which its error messages start
// with or quote, to the create form's fields.
var createFields = []struct{ api, field string }{
	{"name ", "name"},
	{"cpu_millis", "size"},
	{"memory_gbs", "size"},
	{"region_code", "region"},
	{"environment_tag", "environment"},
	{"replica_count", "replicas"},
	{"addon", "addons"},
}

// fieldOf is the create form's field an error message is about, "" when
// it is about none (a quota, the host's capacity).
func fieldOf(msg string) string {
	for _, f := range createFields {
		if strings.HasPrefix(msg, f.api) || (f.api != "name " && strings.Contains(msg, f.api)) {
			return f.field
		}
	}
	return ""
}
