package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"dbcloud"
)

// page is what every template gets.
type page struct {
	Title    string
	User     *dbcloud.User
	CSRF     string
	Projects []*dbcloud.Project
	Project  *dbcloud.Project
	Role     string
	// Can says which of the role table's actions the user may take here,
	// so the page offers only what will work (the domain checks anyway).
	Can map[string]bool
	// Error is the domain's message for what failed; Notice says what
	// worked; Secret is shown once (a new password or key) and never again.
	Error, Notice string
	Secret        []secret
	Data          any
}

// secret is one value shown once, with the id its copy button names.
type secret struct {
	ID, Label, Value string
}

var funcs = template.FuncMap{
	"when": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		case *time.Time:
			if t == nil {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		return ""
	},
	"lower":  strings.ToLower,
	"mb":     func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) },
	"access": accessLabel,
	"used":   lastUsed,
}

// parseTemplates parses each page with the layout, once, at start.
func parseTemplates() map[string]*template.Template {
	out := map[string]*template.Template{}
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	names, _ := fs.Glob(templateFS, "templates/*.html")
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".html")
		if base == "layout" {
			continue
		}
		out[base] = template.Must(template.Must(layout.Clone()).ParseFS(templateFS, n))
	}
	return out
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	t, ok := h.tmpl[name]
	if !ok {
		http.Error(w, "no page "+name, http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout.html", p); err != nil {
		h.logger.Error("render", "page", name, "err", err)
		http.Error(w, "Internal error.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// safeNext keeps a post-sign-in redirect on this origin.
func safeNext(next string) string {
	// Browsers drop tabs and newlines from URLs, so "/\t/evil" would
	// become "//evil", another origin: refuse every control character.
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") ||
		strings.IndexFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
		return "/"
	}
	return next
}

// errorMessage is what the user sees of an error: the domain's message,
// or a generic one for an internal error (which is logged in full).
func (h *Handler) errorMessage(r *http.Request, err error) string {
	var de *dbcloud.Error
	if errorsAs(err, &de) {
		return de.Message
	}
	path := r.URL.Path
	if strings.HasPrefix(path, "/invite/") {
		path = "/invite/..." // the rest is an invitation's secret
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The browser navigated away mid-request: nobody sees this page.
		h.logger.Info("console request abandoned by client", "path", path, "err", err)
		return "Internal error."
	}
	h.logger.Error("console", "path", path, "err", err)
	return "Internal error."
}
