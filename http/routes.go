package http

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

type handlerFn = func(w http.ResponseWriter, r *http.Request) (int, any, error)

// routes is the table of API operations. Each handler decodes, calls the
// domain once, and returns the status and body to encode.
func (h *Handler) routes() []Route {
	get := func(path string, fn handlerFn) Route { return Route{Method: "GET", Path: path, fn: fn} }
	post := func(path string, body bool, fn handlerFn) Route {
		return Route{Method: "POST", Path: path, Body: body, fn: fn}
	}
	del := func(path string, fn handlerFn) Route { return Route{Method: "DELETE", Path: path, fn: fn} }
	const (
		project = "/projects/{project_id}"
		vpc     = project + "/vpcs/{vpc_id}"
		service = project + "/services/{service_id}"
		rset    = service + "/replicaSets/{replica_set_id}"
	)
	return []Route{
		get("/auth/info", h.authInfo),
		post("/auth/logout", true, h.logout),
		post("/analytics/identify", false, h.analytics),
		post("/analytics/track", false, h.analytics),
		get("/projects", h.listProjects),

		get(project+"/vpcs", h.listVPCs),
		post(project+"/vpcs", true, h.createVPC),
		get(vpc, h.getVPC),
		del(vpc, h.deleteVPC),
		post(vpc+"/rename", true, h.renameVPC),
		get(vpc+"/peerings", h.listPeerings),
		post(vpc+"/peerings", true, h.createPeering),
		get(vpc+"/peerings/{peering_id}", h.getPeering),
		del(vpc+"/peerings/{peering_id}", h.deletePeering),

		get(project+"/services", h.listServices),
		post(project+"/services", true, h.createService),
		get(service, h.getService),
		del(service, h.deleteService),
		post(service+"/start", false, h.startService),
		post(service+"/stop", false, h.stopService),
		post(service+"/attachToVPC", true, h.attachVPC),
		post(service+"/detachFromVPC", true, h.detachVPC),
		post(service+"/resize", true, h.resizeService),
		post(service+"/upgrade", true, h.upgradeService),
		post(service+"/enablePooler", false, h.setPooler(true)),
		post(service+"/disablePooler", false, h.setPooler(false)),
		post(service+"/forkService", true, h.forkService),
		post(service+"/updatePassword", true, h.updatePassword),
		post(service+"/setEnvironment", true, h.setEnvironment),
		post(service+"/setAutoPause", true, h.setAutoPause),
		get(service+"/logs", h.logs),
		post(service+"/setHA", true, h.setHA),
		post(service+"/rename", true, h.renameService),
		get(service+"/metrics/available-series", h.metricsAvailableSeries),
		post(service+"/metrics/series", true, h.metricsSeries),

		get(service+"/replicaSets", h.listReplicaSets),
		post(service+"/replicaSets", true, h.createReplicaSet),
		del(rset, h.deleteReplicaSet),
		post(rset+"/resize", true, h.resizeReplicaSet),
		post(rset+"/enablePooler", false, h.setReplicaSetPooler(true)),
		post(rset+"/disablePooler", false, h.setReplicaSetPooler(false)),
		post(rset+"/setEnvironment", true, h.setReplicaSetEnvironment),

		// History and events (beyond the document; see http/history.go).
		get(project+"/events", h.events),
		get(project+"/operations/{operation_id}", h.getOperation),
		get(service+"/operations", h.listOperations(serviceScope)),
		get(rset+"/operations", h.listOperations(replicaSetScope)),
		get(vpc+"/operations", h.listOperations(vpcScope)),
		get(vpc+"/peerings/{peering_id}/operations", h.listOperations(peeringScope)),
		get(service+"/snapshots", h.listSnapshots),

		// Database credentials (beyond the document; http/credentials.go).
		get(service+"/credentials", h.listCredentials),
		post(service+"/credentials", true, h.createCredential),
		del(service+"/credentials/{credential_id}", h.revokeCredential),
	}
}

func message(status int, msg string, err error) (int, any, error) {
	if err != nil {
		return 0, nil, err
	}
	return status, messageJSON{Message: msg}, nil
}

func (h *Handler) authInfo(w http.ResponseWriter, r *http.Request) (int, any, error) {
	return http.StatusOK, toAuthInfo(cloud.PrincipalFromContext(r.Context())), nil
}

// logout ends the caller's OAuth login (every token of it), and that of
// the refresh token in the optional body (the original CLI's
// {"refresh_token"}). API keys have no session: they stay valid until
// revoked, so for a key this is a successful no-op.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in struct {
		RefreshToken string `json:"refresh_token"`
	}
	if b, _ := io.ReadAll(r.Body); len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &in); err != nil {
			return 0, nil, dbcloud.Errorf(dbcloud.KindInvalid, "The request body is not valid JSON: %v.", err)
		}
	}
	if err := h.cloud.Logout(r.Context(), in.RefreshToken); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

// analytics answers the original clients' usage reports: a self-hosted
// server collects no usage data, so the body is neither kept nor sent on.
func (h *Handler) analytics(w http.ResponseWriter, r *http.Request) (int, any, error) {
	return http.StatusNoContent, nil, nil
}

func (h *Handler) listProjects(w http.ResponseWriter, r *http.Request) (int, any, error) {
	ps, err := h.cloud.ListProjects(r.Context())
	if err != nil {
		return 0, nil, err
	}
	out := make([]projectJSON, len(ps))
	for i, p := range ps {
		out[i] = toProject(p)
	}
	return http.StatusOK, out, nil
}

func (h *Handler) listVPCs(w http.ResponseWriter, r *http.Request) (int, any, error) {
	vs, err := h.cloud.ListVPCs(r.Context(), r.PathValue("project_id"))
	if err != nil {
		return 0, nil, err
	}
	out := make([]vpcJSON, len(vs))
	for i, v := range vs {
		out[i] = toVPC(v)
	}
	return http.StatusOK, out, nil
}

func (h *Handler) createVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in vpcCreateRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("cidr", in.CIDR, "name", in.Name, "region_code", in.RegionCode); err != nil {
		return 0, nil, err
	}
	v, err := h.cloud.CreateVPC(r.Context(), r.PathValue("project_id"),
		cloud.VPCCreate{Name: *in.Name, CIDR: *in.CIDR, Region: *in.RegionCode})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, toVPC(v), nil
}

func (h *Handler) getVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	v, err := h.cloud.GetVPC(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toVPC(v), nil
}

func (h *Handler) deleteVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	if err := h.cloud.DeleteVPC(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id")); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (h *Handler) renameVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in nameRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("name", in.Name); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.RenameVPC(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"), *in.Name)
	return message(http.StatusOK, msg, err)
}

func (h *Handler) listPeerings(w http.ResponseWriter, r *http.Request) (int, any, error) {
	ps, err := h.cloud.ListPeerings(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"))
	if err != nil {
		return 0, nil, err
	}
	out := make([]peeringJSON, len(ps))
	for i, p := range ps {
		out[i] = toPeering(p)
	}
	return http.StatusOK, out, nil
}

func (h *Handler) createPeering(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in peeringCreateRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("peer_account_id", in.PeerAccountID, "peer_region_code", in.PeerRegionCode, "peer_vpc_id", in.PeerVPCID); err != nil {
		return 0, nil, err
	}
	p, err := h.cloud.CreatePeering(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"), cloud.PeeringCreate{
		PeerAccountID: *in.PeerAccountID, PeerRegionCode: *in.PeerRegionCode, PeerVPCID: *in.PeerVPCID,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, toPeering(p), nil
}

func (h *Handler) getPeering(w http.ResponseWriter, r *http.Request) (int, any, error) {
	p, err := h.cloud.GetPeering(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"), r.PathValue("peering_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toPeering(p), nil
}

func (h *Handler) deletePeering(w http.ResponseWriter, r *http.Request) (int, any, error) {
	err := h.cloud.DeletePeering(r.Context(), r.PathValue("project_id"), r.PathValue("vpc_id"), r.PathValue("peering_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (h *Handler) listServices(w http.ResponseWriter, r *http.Request) (int, any, error) {
	pid := r.PathValue("project_id")
	revs := func() (encodedRevs, bool, error) {
		rev, ok, err := h.cloud.ServicesRevision(r.Context(), pid)
		return encodedRevs{project: rev}, ok, err
	}
	return h.encodedRead(encodedKey{project: pid}, revs, func() (any, bool, error) {
		vs, err := h.cloud.ListServices(r.Context(), pid)
		if err != nil {
			return nil, false, err
		}
		out := make([]*serviceJSON, len(vs))
		for i, v := range vs {
			out[i] = toService(v)
		}
		return out, false, nil
	})
}

func (h *Handler) createService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in serviceCreateRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("name", in.Name); err != nil {
		return 0, nil, err
	}
	v, err := h.cloud.CreateService(r.Context(), r.PathValue("project_id"), cloud.ServiceCreate{
		Name: *in.Name, Addons: in.Addons, CPUMillis: str(in.CPUMillis), MemoryGBs: str(in.MemoryGBs),
		Environment: str(in.EnvironmentTag), Region: str(in.RegionCode), Replicas: in.ReplicaCount,
		PGVersion: in.PGVersion,
	})
	return serviceResult(v, err)
}

func serviceResult(v *cloud.ServiceView, err error) (int, any, error) {
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, toService(v), nil
}

func (h *Handler) getService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	pid, id := r.PathValue("project_id"), r.PathValue("service_id")
	revs := func() (encodedRevs, bool, error) {
		project, own, ok, err := h.cloud.ServiceRevisions(r.Context(), pid, id)
		return encodedRevs{project: project, own: own}, ok, err
	}
	return h.encodedRead(encodedKey{project: pid, service: id}, revs, func() (any, bool, error) {
		v, err := h.cloud.GetService(r.Context(), pid, id)
		if err != nil {
			return nil, false, err
		}
		// A service's view under its own counter; a replica set's shows
		// its parent too, and stays under the project's.
		return toService(v), v.StandbyOf == "", nil
	})
}

func (h *Handler) renameService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in nameRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("name", in.Name); err != nil {
		return 0, nil, err
	}
	v, err := h.cloud.RenameService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.Name)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toService(v), nil
}

func (h *Handler) deleteService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	if err := h.cloud.DeleteService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id")); err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, nil, nil
}

func (h *Handler) startService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	return serviceResult(h.cloud.StartService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id")))
}

func (h *Handler) stopService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	return serviceResult(h.cloud.StopService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id")))
}

func (h *Handler) attachVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in vpcIDRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("vpc_id", in.VPCID); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.AttachVPC(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.VPCID)
	return message(http.StatusAccepted, msg, err)
}

func (h *Handler) detachVPC(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in vpcIDRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("vpc_id", in.VPCID); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.DetachVPC(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.VPCID)
	return message(http.StatusAccepted, msg, err)
}

func (h *Handler) resizeService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in resizeRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("cpu_millis", in.CPUMillis, "memory_gbs", in.MemoryGBs); err != nil {
		return 0, nil, err
	}
	return serviceResult(h.cloud.ResizeService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.CPUMillis, *in.MemoryGBs))
}

func (h *Handler) upgradeService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in upgradeRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	// pg_version is required: the service layer says so, after the
	// caller is known to see the project.
	return serviceResult(h.cloud.UpgradeService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"),
		cloud.UpgradeRequest{PGVersion: in.PGVersion, Method: dbcloud.UpgradeMethod(str(in.Method))}))
}

func (h *Handler) setPooler(enabled bool) handlerFn {
	return func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		msg, err := h.cloud.SetPooler(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), enabled)
		return message(http.StatusOK, msg, err)
	}
}

func (h *Handler) forkService(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in forkRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("fork_strategy", in.ForkStrategy); err != nil {
		return 0, nil, err
	}
	return serviceResult(h.cloud.ForkService(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), cloud.ServiceFork{
		Strategy: *in.ForkStrategy, Name: in.Name, CPUMillis: str(in.CPUMillis), MemoryGBs: str(in.MemoryGBs),
		Environment: str(in.EnvironmentTag), TargetTime: in.TargetTime, PGVersion: in.PGVersion,
	}))
}

func (h *Handler) updatePassword(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in passwordRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("password", in.Password); err != nil {
		return 0, nil, err
	}
	if err := h.cloud.UpdatePassword(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.Password); err != nil {
		return 0, nil, err
	}
	return http.StatusNoContent, nil, nil
}

func (h *Handler) setEnvironment(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in environmentRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("environment", in.Environment); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.SetEnvironment(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.Environment)
	return message(http.StatusOK, msg, err)
}

// setAutoPause answers 200 with the service: the setting is in effect at
// once (decisions.md section 10).
func (h *Handler) setAutoPause(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in autoPauseRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("idle_seconds", in.IdleSeconds); err != nil {
		return 0, nil, err
	}
	v, err := h.cloud.SetAutoPause(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), *in.IdleSeconds)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toService(v), nil
}

func (h *Handler) setHA(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in haRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	return serviceResult(h.cloud.SetHA(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"),
		cloud.HAChange{Replicas: in.ReplicaCount, SyncReplicas: in.SyncReplicaCount}))
}

func (h *Handler) logs(w http.ResponseWriter, r *http.Request) (int, any, error) {
	q, err := logQuery(r)
	if err != nil {
		return 0, nil, err
	}
	page, err := h.cloud.Logs(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), q)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, toLogs(page), nil
}

// logQuery reads the logs query parameters; a malformed one is a 400 that
// names it.
func logQuery(r *http.Request) (dbcloud.LogQuery, error) {
	v := r.URL.Query()
	q := dbcloud.LogQuery{Cursor: v.Get("cursor"), Search: v["search"], Severities: v["severities"]}
	if s := v.Get("node"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, dbcloud.Errorf(dbcloud.KindInvalid, "node must be a whole number 0 or more, got %q.", s)
		}
		q.Node = &n
	}
	for _, p := range []struct {
		name string
		dst  **time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		s := v.Get(p.name)
		if s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return q, dbcloud.Errorf(dbcloud.KindInvalid, "%s must be an RFC 3339 date-time such as 2026-01-02T15:04:05Z, got %q.", p.name, s)
		}
		*p.dst = &t
	}
	return q, nil
}

func (h *Handler) listReplicaSets(w http.ResponseWriter, r *http.Request) (int, any, error) {
	rs, err := h.cloud.ListReplicaSets(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"))
	if err != nil {
		return 0, nil, err
	}
	out := make([]*replicaSetJSON, len(rs))
	for i, x := range rs {
		out[i] = toReplicaSet(x)
	}
	return http.StatusOK, out, nil
}

func (h *Handler) createReplicaSet(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in replicaSetCreateRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("cpu_millis", in.CPUMillis, "memory_gbs", in.MemoryGBs, "name", in.Name, "nodes", in.Nodes); err != nil {
		return 0, nil, err
	}
	rs, err := h.cloud.CreateReplicaSet(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), cloud.ReplicaSetCreate{
		Name: *in.Name, CPUMillis: *in.CPUMillis, MemoryGBs: *in.MemoryGBs, Nodes: *in.Nodes,
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, toReplicaSet(rs), nil
}

func (h *Handler) deleteReplicaSet(w http.ResponseWriter, r *http.Request) (int, any, error) {
	err := h.cloud.DeleteReplicaSet(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), r.PathValue("replica_set_id"))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, nil, nil
}

func (h *Handler) resizeReplicaSet(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in resizeRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("cpu_millis", in.CPUMillis, "memory_gbs", in.MemoryGBs); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.ResizeReplicaSet(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), r.PathValue("replica_set_id"),
		cloud.ReplicaSetResize{CPUMillis: *in.CPUMillis, MemoryGBs: *in.MemoryGBs, Nodes: in.Nodes})
	return message(http.StatusAccepted, msg, err)
}

func (h *Handler) setReplicaSetPooler(enabled bool) handlerFn {
	return func(w http.ResponseWriter, r *http.Request) (int, any, error) {
		msg, err := h.cloud.SetReplicaSetPooler(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), r.PathValue("replica_set_id"), enabled)
		return message(http.StatusOK, msg, err)
	}
}

func (h *Handler) setReplicaSetEnvironment(w http.ResponseWriter, r *http.Request) (int, any, error) {
	var in environmentRequest
	if err := decode(r, &in); err != nil {
		return 0, nil, err
	}
	if err := required("environment", in.Environment); err != nil {
		return 0, nil, err
	}
	msg, err := h.cloud.SetReplicaSetEnvironment(r.Context(), r.PathValue("project_id"), r.PathValue("service_id"), r.PathValue("replica_set_id"), *in.Environment)
	return message(http.StatusOK, msg, err)
}
