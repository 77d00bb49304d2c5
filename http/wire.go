package http

import (
	"fmt"
	"time"

	"dbcloud/cloud"

	"dbcloud"
)

// Wire types: the JSON of openapi.yaml, field for field. They are converted
// to and from domain types here and nowhere else, so the domain never
// depends on the shape of the wire.

type projectJSON struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

type vpcJSON struct {
	ID         string `json:"id"`
	CIDR       string `json:"cidr"`
	Name       string `json:"name"`
	RegionCode string `json:"region_code"`
}

type peeringJSON struct {
	ID             string `json:"id"`
	PeerAccountID  string `json:"peer_account_id"`
	PeerRegionCode string `json:"peer_region_code"`
	PeerVPCID      string `json:"peer_vpc_id"`
	ErrorMessage   string `json:"error_message,omitempty"`
	ProvisionedID  string `json:"provisioned_id,omitempty"`
	Status         string `json:"status,omitempty"`
}

type endpointJSON struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

type vpcEndpointJSON struct {
	Host  string `json:"host"`
	Port  int    `json:"port"`
	VPCID string `json:"vpc_id"`
}

type poolerJSON struct {
	Endpoint *endpointJSON `json:"endpoint,omitempty"`
}

type resourceSpecJSON struct {
	CPUMillis *int   `json:"cpu_millis,omitempty"`
	MemoryGBs *int   `json:"memory_gbs,omitempty"`
	Volume    string `json:"volume_type,omitempty"`
}

type resourceJSON struct {
	ID   string           `json:"id"`
	Spec resourceSpecJSON `json:"spec"`
}

type forkedFromJSON struct {
	IsStandby bool   `json:"is_standby"`
	ProjectID string `json:"project_id"`
	ServiceID string `json:"service_id"`
}

type haJSON struct {
	ReplicaCount     int `json:"replica_count"`
	SyncReplicaCount int `json:"sync_replica_count"`
}

type metadataJSON struct {
	Environment string `json:"environment"`
	// PGVersion and PGVersionFull say which PostgreSQL the service runs
	// (decisions.md section 11).
	PGVersion     int    `json:"pg_version,omitempty"`
	PGVersionFull string `json:"pg_version_full,omitempty"`
}

type metricsJSON struct {
	MemoryMB  int64 `json:"memory_mb"`
	MilliCPU  int64 `json:"milli_cpu"`
	StorageMB int64 `json:"storage_mb"`
}

type serviceJSON struct {
	Created          time.Time         `json:"created"`
	Name             string            `json:"name"`
	ProjectID        string            `json:"project_id"`
	RegionCode       string            `json:"region_code"`
	Resources        []resourceJSON    `json:"resources"`
	ServiceID        string            `json:"service_id"`
	ServiceType      string            `json:"service_type"`
	Status           string            `json:"status"`
	StatusReason     string            `json:"status_reason,omitempty"`
	ConnectionPooler *poolerJSON       `json:"connection_pooler,omitempty"`
	Endpoint         *endpointJSON     `json:"endpoint,omitempty"`
	ForkedFrom       *forkedFromJSON   `json:"forked_from,omitempty"`
	HAReplicas       *haJSON           `json:"ha_replicas,omitempty"`
	InitialPassword  string            `json:"initial_password,omitempty"`
	Metadata         *metadataJSON     `json:"metadata,omitempty"`
	Metrics          *metricsJSON      `json:"metrics,omitempty"`
	ReadReplicaSets  []*replicaSetJSON `json:"read_replica_sets,omitempty"`
	VPCEndpoint      *vpcEndpointJSON  `json:"vpcEndpoint,omitempty"`
	// vpc_endpoint repeats vpcEndpoint for clients that read snake case.
	VPCEndpointSnake *vpcEndpointJSON `json:"vpc_endpoint,omitempty"`
	AutoPause        *autoPauseJSON   `json:"auto_pause,omitempty"`
	PausedAt         *time.Time       `json:"paused_at,omitempty"`
}

type autoPauseJSON struct {
	IdleSeconds int `json:"idle_seconds"`
}

type replicaSetJSON struct {
	ID               string        `json:"id"`
	CPUMillis        int           `json:"cpu_millis"`
	MemoryGBs        int           `json:"memory_gbs"`
	Name             string        `json:"name"`
	Nodes            int           `json:"nodes"`
	Status           string        `json:"status"`
	ConnectionPooler *poolerJSON   `json:"connection_pooler,omitempty"`
	Endpoint         *endpointJSON `json:"endpoint,omitempty"`
	Metadata         *metadataJSON `json:"metadata,omitempty"`
}

type messageJSON struct {
	Message string `json:"message"`
}

type logEntryJSON struct {
	Message   string `json:"message"`
	Severity  string `json:"severity"`
	Timestamp string `json:"timestamp"`
}

type logsJSON struct {
	Logs       []string       `json:"logs"`
	Entries    []logEntryJSON `json:"entries"`
	LastCursor string         `json:"lastCursor,omitempty"`
	// last_cursor repeats lastCursor for clients that read snake case.
	LastCursorSnake string `json:"last_cursor,omitempty"`
}

type userJSON struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Email string `json:"email"`
}

type keyProjectJSON struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	PlanType string `json:"plan_type"`
}

type apiKeyInfoJSON struct {
	PublicKey   string         `json:"public_key"`
	Name        string         `json:"name"`
	Created     time.Time      `json:"created"`
	Project     keyProjectJSON `json:"project"`
	IssuingUser userJSON       `json:"issuing_user"`
}

type authInfoJSON struct {
	Type   string          `json:"type"`
	APIKey *apiKeyInfoJSON `json:"api_key,omitempty"`
	// apiKey repeats api_key for clients that read camel case.
	APIKeyCamel *apiKeyInfoJSON `json:"apiKey,omitempty"`
	OAuth       *oauthInfoJSON  `json:"oauth,omitempty"`
}

type oauthInfoJSON struct {
	User userJSON `json:"user"`
}

// Request bodies. Pointers tell a missing field from an empty one.

type vpcCreateRequest struct {
	CIDR       *string `json:"cidr"`
	Name       *string `json:"name"`
	RegionCode *string `json:"region_code"`
}

type nameRequest struct {
	Name *string `json:"name"`
}

type peeringCreateRequest struct {
	PeerAccountID  *string `json:"peer_account_id"`
	PeerRegionCode *string `json:"peer_region_code"`
	PeerVPCID      *string `json:"peer_vpc_id"`
}

type serviceCreateRequest struct {
	Name           *string  `json:"name"`
	Addons         []string `json:"addons"`
	CPUMillis      *string  `json:"cpu_millis"`
	MemoryGBs      *string  `json:"memory_gbs"`
	EnvironmentTag *string  `json:"environment_tag"`
	RegionCode     *string  `json:"region_code"`
	ReplicaCount   *int     `json:"replica_count"`
	PGVersion      *int     `json:"pg_version"`
}

type forkRequest struct {
	ForkStrategy   *string    `json:"fork_strategy"`
	Name           *string    `json:"name"`
	CPUMillis      *string    `json:"cpu_millis"`
	MemoryGBs      *string    `json:"memory_gbs"`
	TargetTime     *time.Time `json:"target_time"`
	EnvironmentTag *string    `json:"environment_tag"`
	PGVersion      *int       `json:"pg_version"`
}

type resizeRequest struct {
	CPUMillis *string `json:"cpu_millis"`
	MemoryGBs *string `json:"memory_gbs"`
	Nodes     *int    `json:"nodes"`
}

// upgradeRequest is an upgradeService body (decisions.md section 11).
type upgradeRequest struct {
	PGVersion *int    `json:"pg_version"`
	Method    *string `json:"method"`
}

type vpcIDRequest struct {
	VPCID *string `json:"vpc_id"`
}

type autoPauseRequest struct {
	IdleSeconds *int `json:"idle_seconds"`
}

type environmentRequest struct {
	Environment *string `json:"environment"`
}

type passwordRequest struct {
	Password *string `json:"password"`
}

type haRequest struct {
	ReplicaCount     *int `json:"replica_count"`
	SyncReplicaCount *int `json:"sync_replica_count"`
}

type replicaSetCreateRequest struct {
	CPUMillis *float64 `json:"cpu_millis"`
	MemoryGBs *float64 `json:"memory_gbs"`
	Name      *string  `json:"name"`
	Nodes     *int     `json:"nodes"`
}

// required reports a missing required field the way every endpoint does.
func required(fields ...any) error {
	for i := 0; i+1 < len(fields); i += 2 {
		name := fields[i].(string)
		missing := false
		switch v := fields[i+1].(type) {
		case *string:
			missing = v == nil
		case *int:
			missing = v == nil
		case *float64:
			missing = v == nil
		default:
			panic(fmt.Sprintf("required: unsupported type %T", v))
		}
		if missing {
			return dbcloud.Errorf(dbcloud.KindInvalid, "%s is required.", name)
		}
	}
	return nil
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// Conversions from domain to wire.

func toProject(p *dbcloud.Project) projectJSON { return projectJSON{ID: p.ID, Name: p.Name} }

func toVPC(v *dbcloud.VPC) vpcJSON {
	return vpcJSON{ID: v.ID, CIDR: v.CIDR.String(), Name: v.Name, RegionCode: v.Region}
}

func toPeering(p *dbcloud.Peering) peeringJSON {
	return peeringJSON{
		ID: p.ID, PeerAccountID: p.PeerAccountID, PeerRegionCode: p.PeerRegionCode, PeerVPCID: p.PeerVPCID,
		ErrorMessage: p.ErrorMessage, ProvisionedID: p.ProvisionedID, Status: string(p.Status),
	}
}

func toEndpoint(e *dbcloud.Endpoint) *endpointJSON {
	if e == nil {
		return nil
	}
	return &endpointJSON{Host: e.Host, Port: e.Port}
}

func toResourceSpec(s dbcloud.Size) resourceSpecJSON {
	if s.Shared {
		// A shared size has no dedicated amounts to report.
		return resourceSpecJSON{}
	}
	cpu, mem := s.CPUMillis, s.MemoryGBs
	return resourceSpecJSON{CPUMillis: &cpu, MemoryGBs: &mem}
}

func toService(v *cloud.ServiceView) *serviceJSON {
	s := v.Service
	out := &serviceJSON{
		Created: s.Created, Name: s.Name, ProjectID: s.ProjectID, RegionCode: s.Region,
		ServiceID: s.ID, ServiceType: string(s.Type), Status: string(s.Status), StatusReason: s.StatusReason,
		Endpoint:        toEndpoint(s.Endpoint),
		InitialPassword: v.InitialPassword,
		Metadata: &metadataJSON{
			Environment: string(s.Spec.Environment), PGVersion: s.Spec.PGVersion, PGVersionFull: s.PGVersionFull,
		},
	}
	spec := toResourceSpec(s.Spec.Size)
	if len(s.Instances) > 0 {
		for _, in := range s.Instances {
			out.Resources = append(out.Resources, resourceJSON{ID: in.ID, Spec: spec})
		}
	} else {
		// Not observed yet: one entry per instance the spec asks for.
		for i := 0; i <= s.Spec.Replicas; i++ {
			out.Resources = append(out.Resources, resourceJSON{ID: fmt.Sprintf("%s-%d", s.ID, i), Spec: spec})
		}
	}
	if v.StandbyOf != "" {
		out.ForkedFrom = &forkedFromJSON{IsStandby: true, ProjectID: s.ProjectID, ServiceID: v.StandbyOf}
	} else {
		out.HAReplicas = &haJSON{ReplicaCount: s.Spec.Replicas, SyncReplicaCount: s.Spec.SyncReplicas}
		if s.Fork != nil {
			out.ForkedFrom = &forkedFromJSON{ProjectID: s.Fork.ProjectID, ServiceID: s.Fork.ServiceID}
		}
	}
	if s.Spec.Pooler {
		out.ConnectionPooler = &poolerJSON{Endpoint: toEndpoint(s.PoolerEndpoint)}
	}
	if m := s.Metrics; m != nil {
		out.Metrics = &metricsJSON{MemoryMB: m.MemoryMB, MilliCPU: m.MilliCPU, StorageMB: m.StorageMB}
	}
	if e := s.VPCEndpoint; e != nil {
		out.VPCEndpoint = &vpcEndpointJSON{Host: e.Host, Port: e.Port, VPCID: e.VPCID}
		out.VPCEndpointSnake = out.VPCEndpoint
	}
	for _, r := range v.ReplicaSets {
		out.ReadReplicaSets = append(out.ReadReplicaSets, toReplicaSet(r))
	}
	if a := s.AutoPause; a != nil {
		out.AutoPause = &autoPauseJSON{IdleSeconds: a.IdleSeconds}
	}
	if s.AutoPaused() {
		out.PausedAt = s.PausedAt
	}
	return out
}

func toReplicaSet(r *dbcloud.ReadReplicaSet) *replicaSetJSON {
	out := &replicaSetJSON{
		ID: r.ID, CPUMillis: r.Spec.Size.CPUMillis, MemoryGBs: r.Spec.Size.MemoryGBs, Name: r.Name,
		Nodes: r.Spec.Nodes, Status: string(r.Status), Endpoint: toEndpoint(r.Endpoint),
		Metadata: &metadataJSON{Environment: string(r.Spec.Environment)},
	}
	if r.Spec.Pooler {
		out.ConnectionPooler = &poolerJSON{Endpoint: toEndpoint(r.PoolerEndpoint)}
	}
	return out
}

func toLogs(p *dbcloud.LogPage) logsJSON {
	out := logsJSON{
		Logs:       make([]string, len(p.Entries)),
		Entries:    make([]logEntryJSON, len(p.Entries)),
		LastCursor: p.Cursor, LastCursorSnake: p.Cursor,
	}
	for i, e := range p.Entries {
		ts := e.Timestamp.UTC().Format(time.RFC3339Nano)
		out.Entries[i] = logEntryJSON{Message: e.Message, Severity: e.Severity, Timestamp: ts}
		out.Logs[i] = ts + " [" + e.Severity + "] " + e.Message
	}
	return out
}

func toAuthInfo(p *dbcloud.Principal) authInfoJSON {
	if p.Key == nil {
		return authInfoJSON{Type: "oauth", OAuth: &oauthInfoJSON{User: userJSON{ID: p.User.ID, Name: p.User.Name, Email: p.User.Email}}}
	}
	info := &apiKeyInfoJSON{
		PublicKey: p.Key.AccessKey, Name: p.Key.Name, Created: p.Key.Created,
		Project:     keyProjectJSON{ID: p.Project.ID, Name: p.Project.Name, PlanType: p.Project.PlanType},
		IssuingUser: userJSON{ID: p.User.ID, Name: p.User.Name, Email: p.User.Email},
	}
	return authInfoJSON{Type: "apiKey", APIKey: info, APIKeyCamel: info}
}
