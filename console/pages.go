package console

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	apihttp "dbcloud/http"
	"dbcloud/identity"
)

// routes adds the console's project pages. Each GET shows; each POST does
// one domain operation as the signed-in user and then redirects (or, when
// a secret must be shown once, renders it in the answer to the POST).
func (h *Handler) routes() {
	s := h.session
	h.mux.HandleFunc("GET /{$}", s(h.home))
	h.mux.HandleFunc("GET /switch", s(h.switchProject))
	h.mux.HandleFunc("GET /dashboard/services/{sid}", s(h.dashboardService))
	h.mux.HandleFunc("GET /p/{pid}/events", s(h.events))
	h.mux.HandleFunc("GET /p/{pid}/services", s(h.servicesGet))
	h.mux.HandleFunc("POST /p/{pid}/services", s(h.serviceCreate))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}", s(h.serviceGet))
	h.mux.HandleFunc("POST /p/{pid}/services/{sid}/{action}", s(h.serviceAction))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/logs", s(h.logsGet))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/logs.txt", s(h.logsDownload))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/snapshots", s(h.snapshotsGet))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/credentials", s(h.credentialsGet))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/connect", s(h.connectGet))
	h.mux.HandleFunc("GET /p/{pid}/services/{sid}/sql", s(h.sqlGet))
	h.mux.HandleFunc("POST /p/{pid}/services/{sid}/sql", s(h.sqlRun))
	h.mux.HandleFunc("GET /ca.pem", h.caGet)
	h.mux.HandleFunc("GET /account", s(h.accountGet))
	h.mux.HandleFunc("POST /account/password", s(h.passwordChange))
	h.mux.HandleFunc("POST /p/{pid}/services/{sid}/credentials", s(h.credentialCreate))
	h.mux.HandleFunc("POST /p/{pid}/services/{sid}/credentials/{cid}/revoke", s(h.credentialRevoke))
	h.mux.HandleFunc("GET /p/{pid}/vpcs", s(h.vpcsGet))
	h.mux.HandleFunc("POST /p/{pid}/vpcs", s(h.vpcCreate))
	h.mux.HandleFunc("POST /p/{pid}/vpcs/{vid}/delete", s(h.vpcDelete))
	h.mux.HandleFunc("POST /p/{pid}/vpcs/{vid}/peerings", s(h.peeringCreate))
	h.mux.HandleFunc("POST /p/{pid}/vpcs/{vid}/peerings/{peer}/delete", s(h.peeringDelete))
	h.mux.HandleFunc("GET /p/{pid}/keys", s(h.keysGet))
	h.mux.HandleFunc("POST /p/{pid}/keys", s(h.keyCreate))
	h.mux.HandleFunc("POST /p/{pid}/keys/{key}/revoke", s(h.keyRevoke))
	h.mux.HandleFunc("GET /p/{pid}/members", s(h.membersGet))
	h.mux.HandleFunc("POST /p/{pid}/members", s(h.memberSet))
	h.mux.HandleFunc("POST /p/{pid}/members/{uid}/remove", s(h.memberRemove))
	h.peopleRoutes()
}

// flash is what a page shows beside its content after an action.
type flash struct {
	status      int
	err, notice string
	secret      []secret
	// sql is the SQL editor's answer (sql.go).
	sql *sqlResult
}

// done names the notices a redirect after a successful action may show;
// the query carries only the name, so a link cannot make the console say
// anything else.
var done = map[string]string{
	"started":      "Start requested; the status follows below.",
	"stopped":      "Stop requested; the status follows below.",
	"deleted":      "Delete requested.",
	"resized":      "Resize requested.",
	"ha":           "High-availability change requested.",
	"pooler":       "Connection pooler changed.",
	"env":          "Environment changed.",
	"vpc":          "VPC change requested.",
	"renamed":      "Renamed.",
	"rset":         "Read replica set change requested.",
	"revoked":      "API key revoked; its next request is refused.",
	"member":       "Member saved.",
	"removed":      "Member removed.",
	"vpcmade":      "VPC created.",
	"vpcgone":      "VPC deleted.",
	"forked":       "Fork requested.",
	"password":     "Password changed.",
	"peering":      "Peering change requested.",
	"credrevoked":  "Credential revoked; its sessions have ended.",
	"password-own": "Your password is changed; your other sessions and logins have ended.",
	"invrevoked":   "Invitation withdrawn; its link no longer works.",
	"joined":       "Welcome: you are a member of this project now.",
	"project":      "Project created; you are its owner.",
}

// fromQuery is what a page shows beside its content: the answer of the
// form that redirected here, else the notice its query names.
func (h *Handler) fromQuery(r *http.Request, s *session) flash {
	if isLiveRead(r) {
		return flash{status: http.StatusOK}
	}
	if f, ok := h.once.take(onceKey(s), time.Now()); ok {
		return f
	}
	return flash{status: http.StatusOK, notice: done[r.URL.Query().Get("done")]}
}

func (h *Handler) failed(r *http.Request, err error) flash {
	return flash{status: apihttp.StatusOf(err), err: h.errorMessage(r, err)}
}

// base fills what every project page shows: the user, the projects to
// switch between, the current project and the user's role in it.
func (h *Handler) base(r *http.Request, s *session, title string, f flash) (page, error) {
	p := page{Title: title, User: s.principal.User, CSRF: s.principal.Token.CSRF, Error: f.err, Notice: f.notice, Secret: f.secret}
	ps, err := h.cloud.ListProjects(r.Context())
	if err != nil {
		return p, err
	}
	p.Projects = ps
	pid := r.PathValue("pid")
	for _, x := range ps {
		if x.ID == pid {
			p.Project = x
		}
	}
	if pid != "" && p.Project == nil {
		return p, dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", pid)
	}
	if role, ok := s.principal.RoleIn(pid); ok {
		p.Role = string(role)
		p.Can = map[string]bool{}
		for _, a := range identity.Actions {
			p.Can[string(a)] = role.Allows(a)
		}
	}
	return p, nil
}

// show renders a project page, or the error page when even the frame
// cannot be made (an unknown project: 404 like the API).
func (h *Handler) show(w http.ResponseWriter, r *http.Request, s *session, name, title string, f flash, data func() (any, error)) {
	p, err := h.base(r, s, title, f)
	if err == nil {
		p.Data, err = data()
	}
	if err != nil {
		st := apihttp.StatusOf(err)
		h.render(w, r, st, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF, Projects: p.Projects, Error: h.errorMessage(r, err)})
		return
	}
	st := f.status
	if st == 0 {
		st = http.StatusOK
	}
	h.render(w, r, st, name, p)
}

func redirect(w http.ResponseWriter, r *http.Request, to, doneName string) {
	if doneName != "" {
		to += "?done=" + doneName
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func (h *Handler) home(w http.ResponseWriter, r *http.Request, s *session) {
	ps, err := h.cloud.ListProjects(r.Context())
	if err != nil || len(ps) == 0 {
		if err == nil {
			// Nowhere to go yet: make a project, or wait for an invitation.
			h.newProjectPage(w, r, s, flash{notice: "You are not a member of any project yet: make one, or ask a project's owner or admin to invite you."}, "", nil)
			return
		}
		h.render(w, r, http.StatusOK, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF, Error: h.errorMessage(r, err)})
		return
	}
	http.Redirect(w, r, "/p/"+ps[0].ID+"/services", http.StatusSeeOther)
}

func (h *Handler) switchProject(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.URL.Query().Get("project")
	if pid == newProjectChoice {
		http.Redirect(w, r, "/projects/new", http.StatusSeeOther)
		return
	}
	if !dbcloud.IsID(pid) {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/p/"+pid+"/services", http.StatusSeeOther)
}

// dashboardService answers the link the original's CLI prints for a
// service, https://<console>/dashboard/services/<id>: the service's page
// in whichever of the caller's projects holds it.
func (h *Handler) dashboardService(w http.ResponseWriter, r *http.Request, s *session) {
	sid := r.PathValue("sid")
	ps, err := h.cloud.ListProjects(r.Context())
	if err == nil && dbcloud.IsID(sid) {
		for _, p := range ps {
			if _, err := h.cloud.GetService(r.Context(), p.ID, sid); err == nil {
				http.Redirect(w, r, "/p/"+p.ID+"/services/"+sid, http.StatusSeeOther)
				return
			}
		}
	}
	h.render(w, r, http.StatusNotFound, "error", page{User: s.principal.User, CSRF: s.principal.Token.CSRF,
		Title: "Not found", Error: "None of your projects has a service " + sid + "."})
}

// connString is how clients connect (decisions.md section 5); without a
// password when it is no longer known.
func connString(e *dbcloud.Endpoint, password string) string {
	if e == nil {
		return ""
	}
	user := "tsdbadmin"
	if password != "" {
		user += ":" + url.PathEscape(password)
	}
	return fmt.Sprintf("postgresql://%s@%s:%d/tsdb?sslmode=require", user, e.Host, e.Port)
}

type serviceData struct {
	V          *cloud.ServiceView
	Conn       string
	PoolerConn string
	Window     dbcloud.RecoveryWindow
	VPCs       []*dbcloud.VPC
	Sizes      []string
	Size       string
	Now        string
	// Min and Max bound the PITR time picker by the recovery window.
	Min, Max string
	// Charts are the metrics over Range; Operations the newest changes.
	Charts     []chart
	Range      chartRange
	Ranges     []chartRange
	Operations []*dbcloud.Operation
}

func (h *Handler) serviceGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.servicePage(w, r, s, h.fromQuery(r, s))
}

func (h *Handler) servicePage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	pid, sid := r.PathValue("pid"), r.PathValue("sid")
	h.show(w, r, s, "service", "Service", f, func() (any, error) {
		v, err := h.cloud.GetService(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		win, err := h.cloud.ForkWindow(r.Context(), pid, sid)
		if err != nil {
			return nil, err
		}
		vpcs, err := h.cloud.ListVPCs(r.Context(), pid)
		if err != nil {
			return nil, err
		}
		d := serviceData{V: v, Conn: connString(v.Service.Endpoint, ""), Window: win, VPCs: vpcs, Sizes: h.sizes(),
			Size: v.Service.Spec.Size.String(), Now: h.cloud.Now().UTC().Format("2006-01-02T15:04:05")}
		if v.Service.Spec.Pooler {
			d.PoolerConn = connString(v.Service.PoolerEndpoint, "")
		}
		if !win.From.IsZero() {
			d.Min, d.Max = win.From.UTC().Format("2006-01-02T15:04:05"), win.To.UTC().Format("2006-01-02T15:04:05")
		}
		d.Range, d.Ranges = rangeOf(r.URL.Query().Get("range")), chartRanges
		d.Charts = h.serviceCharts(r.Context(), pid, v.Service, d.Range)
		if d.Operations, err = h.recentOperations(r.Context(), pid, sid); err != nil {
			return nil, err
		}
		return d, nil
	})
}

// serviceAction runs one change of a service from its page's forms.
func (h *Handler) serviceAction(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, pid, sid := r.Context(), r.PathValue("pid"), r.PathValue("sid")
	c := h.cloud
	page := "/p/" + pid + "/services/" + sid
	form := r.PostFormValue
	var err error
	var doneName string
	switch r.PathValue("action") {
	case "start":
		err, doneName = ignore(c.StartService(ctx, pid, sid)), "started"
	case "stop":
		err, doneName = ignore(c.StopService(ctx, pid, sid)), "stopped"
	case "delete":
		var v *cloud.ServiceView
		if v, err = c.GetService(ctx, pid, sid); err == nil {
			if form("confirm") != v.Service.Name {
				err = dbcloud.Errorf(dbcloud.KindInvalid, "Type the service's name, %s, to confirm its deletion.", v.Service.Name)
			} else if err = c.DeleteService(ctx, pid, sid); err == nil {
				redirect(w, r, "/p/"+pid+"/services", "deleted")
				return
			}
		}
	case "resize":
		cpu, mem := splitSize(form("size"))
		err, doneName = ignore(c.ResizeService(ctx, pid, sid, cpu, mem)), "resized"
	case "ha":
		n, _ := strconv.Atoi(form("replicas"))
		sync, _ := strconv.Atoi(form("sync_replicas"))
		err, doneName = ignore(c.SetHA(ctx, pid, sid, cloud.HAChange{Replicas: &n, SyncReplicas: &sync})), "ha"
	case "pooler":
		_, err = c.SetPooler(ctx, pid, sid, form("enabled") == "true")
		doneName = "pooler"
	case "environment":
		_, err = c.SetEnvironment(ctx, pid, sid, form("environment"))
		doneName = "env"
	case "attach":
		_, err = c.AttachVPC(ctx, pid, sid, form("vpc_id"))
		doneName = "vpc"
	case "detach":
		_, err = c.DetachVPC(ctx, pid, sid, form("vpc_id"))
		doneName = "vpc"
	case "rename":
		err, doneName = ignore(c.RenameService(ctx, pid, sid, form("name"))), "renamed"
	case "password":
		// A fresh random password, shown once in this answer.
		pw := dbcloud.NewPassword()
		if err = c.UpdatePassword(ctx, pid, sid, pw); err == nil {
			v, gerr := c.GetService(ctx, pid, sid)
			if gerr != nil {
				err = gerr
				break
			}
			h.showOnce(w, r, s, page, flash{notice: "Password changed.", secret: passwordSecrets(pw, connString(v.Service.Endpoint, pw))})
			return
		}
	case "fork":
		in := cloud.ServiceFork{Strategy: form("strategy")}
		if n := form("name"); n != "" {
			in.Name = &n
		}
		if t := form("target_time"); t != "" && in.Strategy == string(dbcloud.ForkPITR) {
			// datetime-local gives minutes or seconds, no zone: it is UTC,
			// as the page says.
			tt, perr := parseLocalUTC(t)
			if perr != nil {
				err = dbcloud.Errorf(dbcloud.KindInvalid, "The target time %q is not a date and time.", t)
				break
			}
			in.TargetTime = &tt
		}
		var v *cloud.ServiceView
		if v, err = c.ForkService(ctx, pid, sid, in); err == nil {
			// The fork's password exists only here: shown once, by the
			// fork's page, so a reload makes no second fork.
			h.showOnce(w, r, s, "/p/"+pid+"/services/"+v.Service.ID, flash{notice: "Fork created; it becomes READY in a moment.",
				secret: passwordSecrets(v.InitialPassword, connString(v.Service.Endpoint, v.InitialPassword))})
			return
		}
	case "replicaset":
		cpu, mem := splitSize(form("size"))
		cf, _ := strconv.ParseFloat(cpu, 64)
		mf, _ := strconv.ParseFloat(mem, 64)
		nodes, _ := strconv.Atoi(form("nodes"))
		_, err = c.CreateReplicaSet(ctx, pid, sid, cloud.ReplicaSetCreate{Name: form("name"), CPUMillis: cf, MemoryGBs: mf, Nodes: nodes})
		doneName = "rset"
	case "replicaset-delete":
		err, doneName = c.DeleteReplicaSet(ctx, pid, sid, form("replica_set_id")), "rset"
	default:
		http.NotFound(w, r)
		return
	}
	if err != nil {
		h.servicePage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, page, doneName)
}

func ignore[T any](_ T, err error) error { return err }

// VPCs.

func (h *Handler) vpcsGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.vpcsPage(w, r, s, h.fromQuery(r, s))
}

// vpcRow is a VPC with its peerings.
type vpcRow struct {
	VPC      *dbcloud.VPC
	Peerings []*dbcloud.Peering
}

func (h *Handler) vpcsPage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	pid := r.PathValue("pid")
	h.show(w, r, s, "vpcs", "VPCs", f, func() (any, error) {
		vs, err := h.cloud.ListVPCs(r.Context(), pid)
		if err != nil {
			return nil, err
		}
		rows := []vpcRow{}
		for _, v := range vs {
			ps, err := h.cloud.ListPeerings(r.Context(), pid, v.ID)
			if err != nil {
				return nil, err
			}
			rows = append(rows, vpcRow{VPC: v, Peerings: ps})
		}
		return rows, nil
	})
}

func (h *Handler) peeringCreate(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	_, err := h.cloud.CreatePeering(r.Context(), pid, r.PathValue("vid"), cloud.PeeringCreate{
		PeerAccountID: r.PostFormValue("peer_account_id"), PeerRegionCode: r.PostFormValue("peer_region_code"), PeerVPCID: r.PostFormValue("peer_vpc_id"),
	})
	if err != nil {
		h.vpcsPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/vpcs", "peering")
}

func (h *Handler) peeringDelete(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.DeletePeering(r.Context(), pid, r.PathValue("vid"), r.PathValue("peer")); err != nil {
		h.vpcsPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/vpcs", "peering")
}

func (h *Handler) vpcCreate(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	_, err := h.cloud.CreateVPC(r.Context(), pid, cloud.VPCCreate{Name: r.PostFormValue("name"), CIDR: r.PostFormValue("cidr"), Region: r.PostFormValue("region")})
	if err != nil {
		h.vpcsPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/vpcs", "vpcmade")
}

func (h *Handler) vpcDelete(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.DeleteVPC(r.Context(), pid, r.PathValue("vid")); err != nil {
		h.vpcsPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/vpcs", "vpcgone")
}

// API keys.

type keysData struct {
	Keys  []*dbcloud.APIKey
	Roles []identity.Role
}

func (h *Handler) keysGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.keysPage(w, r, s, h.fromQuery(r, s))
}

func (h *Handler) keysPage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	h.show(w, r, s, "keys", "API keys", f, func() (any, error) {
		ks, err := h.cloud.ProjectAPIKeys(r.Context(), r.PathValue("pid"))
		return keysData{Keys: ks, Roles: identity.Roles}, err
	})
}

func (h *Handler) keyCreate(w http.ResponseWriter, r *http.Request, s *session) {
	k, err := h.cloud.IssueAPIKey(r.Context(), r.PathValue("pid"), r.PostFormValue("name"), identity.Role(r.PostFormValue("role")))
	if err != nil {
		h.keysPage(w, r, s, h.failed(r, err))
		return
	}
	h.showOnce(w, r, s, "/p/"+r.PathValue("pid")+"/keys", flash{notice: "API key created.", secret: []secret{
		{ID: "access-key", Label: "access key", Value: k.AccessKey}, {ID: "secret-key", Label: "secret key", Value: k.SecretKey},
	}})
}

func (h *Handler) keyRevoke(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.RevokeProjectAPIKey(r.Context(), pid, r.PathValue("key")); err != nil {
		h.keysPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/keys", "revoked")
}

// Members.

type membersData struct {
	Members []cloud.Member
	Roles   []identity.Role
	// Invitations are the pending ones, for those who may invite; Invite
	// is the invitation form as typed, with its error.
	Invitations []*dbcloud.Invitation
	Invite      inviteForm
}

func (h *Handler) membersGet(w http.ResponseWriter, r *http.Request, s *session) {
	h.membersPage(w, r, s, h.fromQuery(r, s))
}

func (h *Handler) membersPage(w http.ResponseWriter, r *http.Request, s *session, f flash) {
	h.membersPageWith(w, r, s, f, inviteForm{Role: identity.Developer})
}

func (h *Handler) membersPageWith(w http.ResponseWriter, r *http.Request, s *session, f flash, inv inviteForm) {
	pid := r.PathValue("pid")
	h.show(w, r, s, "members", "Members", f, func() (any, error) {
		ms, err := h.cloud.ListMembers(r.Context(), pid)
		if err != nil {
			return nil, err
		}
		d := membersData{Members: ms, Roles: identity.Roles, Invite: inv}
		if role, _ := s.principal.RoleIn(pid); role.Allows(identity.ManageMembers) {
			d.Invitations, err = h.cloud.ListInvitations(r.Context(), pid)
		}
		return d, err
	})
}

func (h *Handler) memberSet(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.SetMember(r.Context(), pid, r.PostFormValue("email"), identity.Role(r.PostFormValue("role"))); err != nil {
		h.membersPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/members", "member")
}

func (h *Handler) memberRemove(w http.ResponseWriter, r *http.Request, s *session) {
	pid := r.PathValue("pid")
	if err := h.cloud.RemoveMember(r.Context(), pid, r.PathValue("uid")); err != nil {
		h.membersPage(w, r, s, h.failed(r, err))
		return
	}
	redirect(w, r, "/p/"+pid+"/members", "removed")
}

func passwordSecrets(password, conn string) []secret {
	return []secret{{ID: "password", Label: "password", Value: password}, {ID: "conn", Label: "connection string", Value: conn}}
}
