package dbcloud

import (
	"fmt"
	"time"
)

// ServiceType is derived from a service's addons (decisions.md section 5).
type ServiceType string

// Service types.
const (
	ServiceTypePostgres     ServiceType = "POSTGRES"
	ServiceTypeTimeseriesDB ServiceType = "TIMESERIESDB"
	ServiceTypeVector       ServiceType = "VECTOR"
)

// ServiceStatus is the status a client sees. The transition table of
// decisions.md section 6 is transition.go.
type ServiceStatus string

// Service statuses, as the API document names them.
const (
	StatusQueued      ServiceStatus = "QUEUED"
	StatusDeleting    ServiceStatus = "DELETING"
	StatusConfiguring ServiceStatus = "CONFIGURING"
	StatusReady       ServiceStatus = "READY"
	StatusDeleted     ServiceStatus = "DELETED"
	StatusUnstable    ServiceStatus = "UNSTABLE"
	StatusPausing     ServiceStatus = "PAUSING"
	StatusPaused      ServiceStatus = "PAUSED"
	StatusResuming    ServiceStatus = "RESUMING"
	StatusUpgrading   ServiceStatus = "UPGRADING"
	StatusOptimizing  ServiceStatus = "OPTIMIZING"
)

// Transitional reports whether the status is on the way to another one, so
// that work for the service is in flight.
func (s ServiceStatus) Transitional() bool {
	switch s {
	case StatusQueued, StatusDeleting, StatusConfiguring, StatusPausing, StatusResuming,
		StatusUpgrading, StatusOptimizing:
		return true
	case StatusReady, StatusDeleted, StatusUnstable, StatusPaused:
		return false
	}
	return false
}

// Environment is a service's environment tag. PROD brings delete protection
// and is required for HA, pooling and read replication.
type Environment string

// Environments.
const (
	EnvDev  Environment = "DEV"
	EnvProd Environment = "PROD"
)

// ParseEnvironment validates an environment tag given by a client.
func ParseEnvironment(field, s string) (Environment, error) {
	switch Environment(s) {
	case EnvDev, EnvProd:
		return Environment(s), nil
	}
	return "", Errorf(KindInvalid, "%s must be DEV or PROD, got %q.", field, s)
}

// Addon is an optional feature of a service, backed by a PostgreSQL extension.
type Addon string

// Addons and the extension each needs.
const (
	AddonTimeSeries Addon = "time-series"
	AddonAI         Addon = "ai"
)

// Extension names the PostgreSQL extension an addon creates in the tsdb database.
func (a Addon) Extension() string {
	switch a {
	case AddonTimeSeries:
		return "timescaledb"
	case AddonAI:
		return "vector"
	}
	return ""
}

// ServiceTypeFor derives the service type from its addons.
func ServiceTypeFor(addons []Addon) ServiceType {
	t := ServiceTypePostgres
	for _, a := range addons {
		switch a {
		case AddonTimeSeries:
			return ServiceTypeTimeseriesDB
		case AddonAI:
			t = ServiceTypeVector
		}
	}
	return t
}

// Endpoint is a host and port that accepts PostgreSQL connections.
type Endpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// VPCEndpoint is a service's address inside a VPC.
type VPCEndpoint struct {
	Endpoint
	VPCID string `json:"vpc_id"`
}

// Metrics is the measured usage of a service's primary.
type Metrics struct {
	MilliCPU  int64     `json:"milli_cpu"`
	MemoryMB  int64     `json:"memory_mb"`
	StorageMB int64     `json:"storage_mb"`
	Measured  time.Time `json:"measured"`
	// Database is measured inside the database and its pooler (history.go).
	Database *DatabaseMetrics `json:"database,omitempty"`
}

// ForkStrategy says which state of the parent a fork holds.
type ForkStrategy string

// Fork strategies (decisions.md section 2).
const (
	ForkLastSnapshot ForkStrategy = "LAST_SNAPSHOT"
	ForkNow          ForkStrategy = "NOW"
	ForkPITR         ForkStrategy = "PITR"
)

// ForkSource records where a fork's data comes from.
type ForkSource struct {
	ProjectID  string       `json:"project_id"`
	ServiceID  string       `json:"service_id"`
	Strategy   ForkStrategy `json:"strategy"`
	TargetTime *time.Time   `json:"target_time,omitempty"`
}

// ServiceSpec is the desired state of a service: what the client asked for.
// Every change bumps Service.Generation so the engine knows there is work.
type ServiceSpec struct {
	Size         Size        `json:"size"`
	Addons       []Addon     `json:"addons,omitempty"`
	Environment  Environment `json:"environment"`
	Replicas     int         `json:"replicas"`
	SyncReplicas int         `json:"sync_replicas"`
	Pooler       bool        `json:"pooler"`
	VPCID        string      `json:"vpc_id,omitempty"`
	// PGVersion is the PostgreSQL major version the service runs: chosen
	// at create, its parent's for a fork (decisions.md section 11).
	PGVersion int `json:"pg_version,omitempty"`
	// Running is false when the client stopped the service.
	Running bool `json:"running"`
}

// Service is a PostgreSQL service: its desired spec and what was last observed.
type Service struct {
	ID        string      `json:"id"`
	ProjectID string      `json:"project_id"`
	Name      string      `json:"name"`
	Region    string      `json:"region"`
	Type      ServiceType `json:"type"`
	Created   time.Time   `json:"created"`

	Spec       ServiceSpec `json:"spec"`
	Generation int64       `json:"generation"`
	Fork       *ForkSource `json:"fork,omitempty"`

	// PasswordVerifier is the SCRAM-SHA-256 verifier of tsdbadmin's password.
	// The plaintext exists only in the create or fork response.
	PasswordVerifier string `json:"password_verifier"`

	Status       ServiceStatus `json:"status"`
	StatusReason string        `json:"status_reason,omitempty"`
	// Notice is the runtime's notice the status reason shows, if it shows
	// one (engine's showNotice): a reason that is not one outlives the
	// measurements.
	Notice string `json:"notice,omitempty"`
	// ObservedGeneration is the generation the runtime last made real.
	ObservedGeneration int64 `json:"observed_generation"`
	// Endpoint is assigned at creation and never changes.
	Endpoint       *Endpoint `json:"endpoint,omitempty"`
	PoolerEndpoint *Endpoint `json:"pooler_endpoint,omitempty"`
	// PoolerPort is the port claimed for the connection pooler when it was
	// first enabled; it stays the service's until the service is deleted.
	PoolerPort  int          `json:"pooler_port,omitempty"`
	VPCEndpoint *VPCEndpoint `json:"vpc_endpoint,omitempty"`
	Metrics     *Metrics     `json:"metrics,omitempty"`
	// AutoPause, when set, pauses the service after IdleSeconds without a
	// client (autopause.go); nil is off.
	AutoPause *AutoPause `json:"auto_pause,omitempty"`
	// PausedAt is when the idle clock paused the service; nil unless it
	// is auto-paused (a stop clears it: a stopped service is not woken).
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// PGVersionFull is the full PostgreSQL version of Spec.PGVersion's
	// binaries ("17.12") when the service was made; "" for a service
	// made before versions were recorded.
	PGVersionFull string `json:"pg_version_full,omitempty"`
	// UpgradeTo is the major version an accepted upgrade moves the
	// service to; 0 when none is under way. Spec.PGVersion stays the
	// version its data is on until the engine has made the upgrade real.
	UpgradeTo int `json:"upgrade_to,omitempty"`
	// UpgradeMethod is how the accepted upgrade is made ("" is IN_PLACE).
	UpgradeMethod UpgradeMethod `json:"upgrade_method,omitempty"`
	// KeptCluster is the old cluster a BLUE_GREEN switch left stopped, as
	// the way back until it expires; nil when there is none.
	KeptCluster *KeptCluster `json:"kept_cluster,omitempty"`
	// Instances lists the running instances, primary first, as last observed.
	Instances []Instance `json:"instances,omitempty"`
}

// Instance is one PostgreSQL server of a service (primary or standby).
type Instance struct {
	ID   string `json:"id"`
	Role string `json:"role"`
}

// ReplicaSetStatus is the status of a read replica set.
type ReplicaSetStatus string

// Read replica set statuses (decisions.md section 7).
const (
	ReplicaSetCreating ReplicaSetStatus = "creating"
	ReplicaSetActive   ReplicaSetStatus = "active"
	ReplicaSetResizing ReplicaSetStatus = "resizing"
	ReplicaSetDeleting ReplicaSetStatus = "deleting"
	ReplicaSetError    ReplicaSetStatus = "error"
)

// ReadReplicaSetSpec is the desired state of a read replica set.
type ReadReplicaSetSpec struct {
	Size        Size        `json:"size"`
	Nodes       int         `json:"nodes"`
	Environment Environment `json:"environment"`
	Pooler      bool        `json:"pooler"`
}

// ReadReplicaSet is a set of hot standbys of a service, behind one endpoint.
type ReadReplicaSet struct {
	ID         string             `json:"id"`
	ProjectID  string             `json:"project_id"`
	ServiceID  string             `json:"service_id"`
	Name       string             `json:"name"`
	Created    time.Time          `json:"created"`
	Spec       ReadReplicaSetSpec `json:"spec"`
	Generation int64              `json:"generation"`

	Status             ReplicaSetStatus `json:"status"`
	StatusReason       string           `json:"status_reason,omitempty"`
	ObservedGeneration int64            `json:"observed_generation"`
	Endpoint           *Endpoint        `json:"endpoint,omitempty"`
	PoolerEndpoint     *Endpoint        `json:"pooler_endpoint,omitempty"`
	// PoolerPort is the port claimed for the set's pooler, as for a service.
	PoolerPort int `json:"pooler_port,omitempty"`
}

// AsService shows a read replica set as the service it is also addressable as.
func (r *ReadReplicaSet) AsService(parent *Service) *Service {
	status := StatusReady
	switch r.Status {
	case ReplicaSetCreating:
		status = StatusQueued
	case ReplicaSetActive:
		status = StatusReady
	case ReplicaSetResizing:
		status = StatusConfiguring
	case ReplicaSetDeleting:
		status = StatusDeleting
	case ReplicaSetError:
		status = StatusUnstable
	}
	instances := make([]Instance, r.Spec.Nodes)
	for i := range instances {
		instances[i] = Instance{ID: fmt.Sprintf("%s-%d", r.ID, i), Role: "replica"}
	}
	return &Service{
		ID: r.ID, ProjectID: r.ProjectID, Name: r.Name, Region: parent.Region, Type: parent.Type,
		Created: r.Created, Generation: r.Generation, Status: status, StatusReason: r.StatusReason,
		Spec: ServiceSpec{
			Size: r.Spec.Size, Environment: r.Spec.Environment, Pooler: r.Spec.Pooler, Running: true,
			PGVersion: parent.Spec.PGVersion,
		},
		Endpoint: r.Endpoint, PoolerEndpoint: r.PoolerEndpoint, PoolerPort: r.PoolerPort, Instances: instances,
		PGVersionFull: parent.PGVersionFull,
	}
}
