package console_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestConsoleCreateFieldErrors: a refused create shows the domain's
// message beside the field it is about, with what was typed kept, and
// makes nothing; HA replicas and the region are taken from the form.
func TestConsoleCreateFieldErrors(t *testing.T) {
	s, b, page := signedIn(t)
	base := s.srv.URL + "/p/" + s.boot.Project.ID
	csrf := csrfOf(t, page)
	if !strings.Contains(page, "<th scope=\"col\">Cost, in 500/2 units</th>") || !strings.Contains(page, "<td><code>2000/8</code></td><td>2 vCPU</td><td>8 GB</td><td>4</td>") {
		t.Errorf("the create form has no size table saying what 2000/8 is\n%s", page)
	}
	for _, c := range []struct {
		form  url.Values
		field string
		kept  string
	}{
		{url.Values{"name": {"   "}, "size": {"1000/4"}, "replicas": {"1"}}, "name", `<option value="1000/4" selected>`},
		{url.Values{"name": {"sized"}, "size": {"999/9"}}, "size", `id="svc-name" name="name" required maxlength="128" value="sized"`},
		{url.Values{"name": {"placed"}, "size": {"500/2"}, "region": {"mars"}}, "region", `value="placed"`},
		{url.Values{"name": {"many"}, "size": {"500/2"}, "replicas": {"7"}}, "replicas", `name="replicas" type="number" min="0" max="2" value="7"`},
	} {
		c.form.Set("csrf", csrf)
		res, page := b.post(base+"/services", c.form)
		if res.StatusCode < 400 || res.Request.Method != "POST" {
			t.Errorf("%s: %d after %s, want the form again with an error", c.field, res.StatusCode, res.Request.Method)
		}
		if !strings.Contains(page, `<p class="field-error" id="err-`+c.field+`">`) || !strings.Contains(page, `aria-describedby="err-`+c.field+`"`) {
			t.Errorf("%s: no error beside the field\n%s", c.field, page)
		}
		if !strings.Contains(page, c.kept) {
			t.Errorf("%s: the typed value %s is not kept\n%s", c.field, c.kept, page)
		}
	}
	if n := len(listServices(t, s)); n != 0 {
		t.Fatalf("%d services after refused creates", n)
	}

	// HA replicas and the region reach the domain.
	b.post(base+"/services", url.Values{"csrf": {csrf}, "name": {"paired"}, "size": {"500/2"}, "replicas": {"1"}, "region": {"local"}})
	svcs := listServices(t, s)
	if len(svcs) != 1 || svcs[0].Service.Spec.Replicas != 1 || svcs[0].Service.Region != "local" {
		t.Fatalf("create with an HA replica: %+v", svcs)
	}
}

// TestConsoleServicesSearch: the list filters by a part of a name or ID
// and shows each service's endpoint.
func TestConsoleServicesSearch(t *testing.T) {
	s, b, page := signedIn(t)
	base := s.srv.URL + "/p/" + s.boot.Project.ID
	csrf := csrfOf(t, page)
	for _, n := range []string{"orders-db", "Orders-Archive", "metrics"} {
		b.post(base+"/services", url.Values{"csrf": {csrf}, "name": {n}, "size": {"500/2"}})
	}
	_, page = b.get(base + "/services?q=orders")
	if !strings.Contains(page, ">orders-db</a>") || !strings.Contains(page, ">Orders-Archive</a>") || strings.Contains(page, ">metrics</a>") ||
		!strings.Contains(page, "2 of 3 services match") {
		t.Errorf("search orders:\n%s", page)
	}
	var metricsID string
	for _, v := range listServices(t, s) {
		if v.Service.Name == "metrics" {
			metricsID = v.Service.ID
			e := v.Service.Endpoint
			if _, all := b.get(base + "/services"); e == nil || !strings.Contains(all, "<th scope=\"col\">Endpoint</th>") ||
				!strings.Contains(all, "<code>"+e.Host+":"+strconv.Itoa(e.Port)+"</code>") {
				t.Errorf("the list shows no endpoint %+v", e)
			}
		}
	}
	if _, page = b.get(base + "/services?q=" + metricsID); !strings.Contains(page, ">metrics</a>") || strings.Contains(page, ">orders-db</a>") {
		t.Errorf("search by ID %s:\n%s", metricsID, page)
	}
	if _, page = b.get(base + "/services?q=nothing-like-it"); !strings.Contains(page, "No service matches") {
		t.Errorf("no match: no word of it\n%s", page)
	}
}
