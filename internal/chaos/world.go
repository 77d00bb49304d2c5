package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"dbcloud"
)

// World is one observation of everything the invariants are about.
type World struct {
	// API is every service GET /services lists, by ID.
	API map[string]APIService
	// VPCs maps each VPC the API lists to its name.
	VPCs map[string]string
	// Operations are the store's operation rows.
	Operations []Operation
	// Ports are the store's port claims: port -> owner.
	Ports map[int]string
	// Processes run from the runtime's service directories.
	Processes []Process
	// Dirs are the entries of the runtime's services directory.
	Dirs []string
	// Cgroups are the instance cgroups (dbcloud/<name>) of the services
	// concerned, by name, e.g. "<id>-0" or "<id>-pooler".
	Cgroups []string
	// Logins are the results of logging in to each service that should
	// accept logins, by service ID.
	Logins map[string][]Login
}

// APIService is a service as the API shows it (the fields the invariants
// need, with the wire names of openapi.yaml).
type APIService struct {
	ServiceID    string `json:"service_id"`
	Name         string `json:"name"`
	Status       string `json:"status"`
	StatusReason string `json:"status_reason"`
	Metadata     struct {
		Environment string `json:"environment"`
	} `json:"metadata"`
	Resources []struct {
		ID   string `json:"id"`
		Spec struct {
			CPUMillis *int `json:"cpu_millis"`
			MemoryGBs *int `json:"memory_gbs"`
		} `json:"spec"`
	} `json:"resources"`
	HAReplicas *struct {
		ReplicaCount int `json:"replica_count"`
	} `json:"ha_replicas"`
	ConnectionPooler *struct {
		Endpoint *Endpoint `json:"endpoint"`
	} `json:"connection_pooler"`
	Endpoint    *Endpoint `json:"endpoint"`
	VPCEndpoint *struct {
		Endpoint
		VPCID string `json:"vpc_id"`
	} `json:"vpcEndpoint"`
	InitialPassword string `json:"initial_password"`
}

// Endpoint is a host and port.
type Endpoint struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Addr is host:port.
func (e Endpoint) Addr() string { return fmt.Sprintf("%s:%d", e.Host, e.Port) }

// Size is the size the API shows (of its first resource).
func (a APIService) Size() Size {
	if len(a.Resources) == 0 {
		return Size{}
	}
	spec := a.Resources[0].Spec
	if spec.CPUMillis == nil {
		return Shared
	}
	mem := ""
	if spec.MemoryGBs != nil {
		mem = fmt.Sprint(*spec.MemoryGBs)
	}
	return Size{CPU: fmt.Sprint(*spec.CPUMillis), Mem: mem}
}

// Replicas is ha_replicas.replica_count.
func (a APIService) Replicas() int {
	if a.HAReplicas == nil {
		return 0
	}
	return a.HAReplicas.ReplicaCount
}

// Operation is a store operation row, as far as the checker cares.
type Operation struct {
	ID, ResourceID, Type, State, Error string
}

// ProcessKind says what a process of a service is.
type ProcessKind string

// Process kinds: a postmaster (not its children), PgBouncer, the endpoint
// proxy, or anything else started on a service's files (a wrapper, a copy).
const (
	Postmaster ProcessKind = "postmaster"
	Pooler     ProcessKind = "pgbouncer"
	Proxy      ProcessKind = "proxy"
	Other      ProcessKind = "other"
)

// Process is a live process working on a service's files.
type Process struct {
	PID       int
	Kind      ProcessKind
	ServiceID string
	// Instance is the instance directory of a postmaster ("0", "1", ...).
	Instance string
	// Listens are the TCP addresses it listens on.
	Listens []string
}

// Login is the outcome of one TLS login as tsdbadmin.
type Login struct {
	Via string // endpoint, pooler or vpc
	Err string // "" when a password was accepted
	// Password is the index in Service.Passwords that was accepted.
	Password      int
	SharedBuffers string
	// Rows is the content of the chaos table (nil when not read).
	Rows map[int64]string
	// RowsErr says why the rows could not be read.
	RowsErr string
}

// ObserveStore reads operations and port claims from the store dbcloud
// uses (opened by the caller: SQLite lets a second process read while
// dbcloud writes).
func ObserveStore(ctx context.Context, st dbcloud.Store, w *World) error {
	return st.View(ctx, func(tx dbcloud.Tx) error {
		ops, err := tx.ListOperations(dbcloud.OperationFilter{})
		if err != nil {
			return err
		}
		w.Operations = w.Operations[:0]
		for _, op := range ops {
			w.Operations = append(w.Operations, Operation{ID: op.ID, ResourceID: op.ResourceID,
				Type: string(op.Type), State: string(op.State), Error: op.Error})
		}
		w.Ports, err = tx.ListPorts()
		return err
	})
}

// ObserveHost reads the service directories under runtimeDir, the
// processes working on them (with their listening sockets), and the
// instance cgroups of the services whose IDs are given or found there.
// Cgroups are shared by every dbcloud on the host, so only those of known
// services are looked at.
func ObserveHost(runtimeDir string, ids []string, w *World) error {
	entries, err := os.ReadDir(filepath.Join(runtimeDir, "services"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	w.Dirs = w.Dirs[:0]
	for _, e := range entries {
		w.Dirs = append(w.Dirs, e.Name())
	}
	w.Processes = serviceProcesses(runtimeDir)
	concerned := slices.Clone(ids)
	concerned = append(concerned, w.Dirs...)
	for _, p := range w.Processes {
		concerned = append(concerned, p.ServiceID)
	}
	sort.Strings(concerned)
	concerned = slices.Compact(concerned)
	w.Cgroups = instanceCgroups(concerned)
	return nil
}

// instanceCgroups lists dbcloud/<id>-* in each cgroup v1 hierarchy an
// instance joins.
func instanceCgroups(ids []string) []string {
	var out []string
	for _, ctrl := range []string{"cpu", "cpuacct", "memory"} {
		for _, id := range ids {
			if id == "" || strings.ContainsAny(id, "/*?[") {
				continue
			}
			groups, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", ctrl, "dbcloud", id+"-*"))
			for _, g := range groups {
				if fi, err := os.Stat(g); err == nil && fi.IsDir() {
					out = append(out, filepath.Base(g))
				}
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}
