// Package local runs services as PostgreSQL processes on this host: the
// embedded default runtime.
package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"dbcloud"
)

// Runtime is the local runtime.
type Runtime struct {
	// BinDir holds the PostgreSQL server binaries (initdb, postgres, ...).
	BinDir string
	// Host is the address endpoints listen on.
	Host string

	once       sync.Once
	extensions map[string]bool
}

var _ dbcloud.Runtime = (*Runtime)(nil)

// New returns a local runtime using the PostgreSQL binaries in binDir.
func New(binDir, host string) (*Runtime, error) {
	if _, err := os.Stat(filepath.Join(binDir, "postgres")); err != nil {
		return nil, fmt.Errorf("PostgreSQL binaries not found in %s (set --pg-bin-dir): %w", binDir, err)
	}
	return &Runtime{BinDir: binDir, Host: host}, nil
}

// Extensions lists the extensions whose control files the installed
// PostgreSQL has, which is what CREATE EXTENSION needs.
func (rt *Runtime) Extensions() map[string]bool {
	rt.once.Do(func() {
		rt.extensions = map[string]bool{}
		out, err := exec.Command(filepath.Join(rt.BinDir, "pg_config"), "--sharedir").Output()
		if err != nil {
			return
		}
		files, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "extension", "*.control"))
		for _, f := range files {
			rt.extensions[strings.TrimSuffix(filepath.Base(f), ".control")] = true
		}
	})
	return rt.extensions
}

// PortFree reports whether the port can be bound on the endpoint host.
func (rt *Runtime) PortFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(rt.Host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// SetPassword is not yet served: services are not provisioned by this
// runtime yet, so none is READY and the domain never calls it.
func (rt *Runtime) SetPassword(ctx context.Context, svc *dbcloud.Service, verifier string) error {
	return dbcloud.Errorf(dbcloud.KindUnavailable, "Service %s is not running on this host.", svc.ID)
}

// Logs returns the service's log lines. Services are not provisioned by
// this runtime yet, so there are none, and no cursor was ever issued.
func (rt *Runtime) Logs(ctx context.Context, svc *dbcloud.Service, q dbcloud.LogQuery) (*dbcloud.LogPage, error) {
	if q.Cursor != "" {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "cursor %q is not a cursor this server issued.", q.Cursor)
	}
	return &dbcloud.LogPage{}, nil
}
