package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"dbcloud/cloud"

	"dbcloud"
	"dbcloud/runtime/local"
	"dbcloud/tlsca"
)

// The operator's service commands: what a person needs without curl to see
// a project's services, stop them all, or take everything down.

// runAdminService runs `dbcloud admin service VERB`.
func runAdminService(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	var a adminCommand
	name := "dbcloud admin service " + verb
	switch verb {
	case "list":
		var project string
		fs := newFlagSet(name, "List a project's services: ID, name, status, size, endpoint.", stderr)
		a.flags(fs)
		fs.StringVar(&project, "project", "", "project ID (required; `dbcloud admin project list` shows them)")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if project == "" {
			return errors.New("--project is required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			p, err := c.FindProjectAdmin(ctx, project)
			if err != nil {
				return err
			}
			vs, err := c.ListServices(cloud.OperatorContext(ctx, p), project)
			if err != nil {
				return err
			}
			out := make([]serviceSummary, len(vs))
			for i, v := range vs {
				out[i] = a.summary(v.Service)
			}
			if a.json {
				return json.NewEncoder(stdout).Encode(out)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tCPU_MILLIS/MEMORY_GBS\tENDPOINT")
			for _, s := range out {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%s\n", s.ID, s.Name, s.Status, s.CPUMillis, s.MemoryGBs, s.Endpoint)
			}
			return tw.Flush()
		})
	case "show":
		var project, id string
		fs := newFlagSet(name, "Show one service, with its connection string (the password is not kept: it was shown once, at create).", stderr)
		a.flags(fs)
		fs.StringVar(&project, "project", "", "project ID (required)")
		fs.StringVar(&id, "id", "", "service ID (required)")
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if project == "" || id == "" {
			return errors.New("--project and --id are required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			p, err := c.FindProjectAdmin(ctx, project)
			if err != nil {
				return err
			}
			v, err := c.GetService(cloud.OperatorContext(ctx, p), project, id)
			if err != nil {
				return err
			}
			s := a.summary(v.Service)
			if a.json {
				return json.NewEncoder(stdout).Encode(s)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "ID\t%s\nName\t%s\nStatus\t%s\n", s.ID, s.Name, s.Status)
			if s.Reason != "" {
				fmt.Fprintf(tw, "Reason\t%s\n", s.Reason)
			}
			fmt.Fprintf(tw, "Size\t%s millicores, %s GB\nEnvironment\t%s\nHA replicas\t%d\nEndpoint\t%s\n",
				s.CPUMillis, s.MemoryGBs, s.Environment, s.Replicas, s.Endpoint)
			if s.Pooler != "" {
				fmt.Fprintf(tw, "Pooler\t%s\n", s.Pooler)
			}
			fmt.Fprintf(tw, "Connect\tpsql '%s'\n\tPassword: the initial_password of the create response, or the one set since.\n", s.ConnectionString)
			return tw.Flush()
		})
	case "stop-all":
		fs := newFlagSet(name, "Stop every running service of every project (data is kept; start them through the API). "+
			"Works with dbcloud serve running or not: without it, this command does the work itself.", stderr)
		a.flags(fs)
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		return a.drive(ctx, stderr, func(c *cloud.Cloud) (int, error) {
			return c.StopAll(ctx)
		}, func(c *cloud.Cloud) (bool, string, error) {
			running, pending, err := c.RunningServices(ctx)
			return running == 0 && pending == 0, fmt.Sprintf("%d services running, %d operations pending", running, pending), err
		}, func(n int) { fmt.Fprintf(stdout, "stopped %d services\n", n) })
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown admin command %q", "service "+verb)
}

// runTeardown runs `dbcloud admin teardown`.
func runTeardown(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var a adminCommand
	fs := newFlagSet("dbcloud admin teardown", "Delete every service and read replica set of every project, stop every "+
		"process dbcloud started for them (by PID), remove their cgroups and directories, the pool's prepared clusters with "+
		"their OS users, and the runtime directory. "+
		"Projects, keys and the store stay. Stop dbcloud serve first (Ctrl-C).", stderr)
	a.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if addr, up := a.serverRunning(); up {
		return fmt.Errorf("dbcloud serve is running on this data directory (%s answers); stop it first (Ctrl-C), "+
			"or delete services through the API", addr)
	}
	var runtimeDir string
	err := a.drive(ctx, stderr, func(c *cloud.Cloud) (int, error) {
		return c.Teardown(ctx)
	}, func(c *cloud.Cloud) (bool, string, error) {
		left, pending, err := c.Remaining(ctx)
		return left == 0 && pending == 0, fmt.Sprintf("%d services and read replica sets left, %d operations pending", left, pending), err
	}, func(n int) { fmt.Fprintf(stdout, "deleted %d services and read replica sets\n", n) }, func(m *Main) error {
		// The pool's prepared clusters each have an OS user of their
		// own, which removing the directory would leave behind.
		if m.runtime != nil {
			if err := m.runtime.DrainPool(ctx); err != nil {
				return err
			}
		}
		runtimeDir, _ = m.runtimeDir()
		return nil
	})
	if err != nil {
		return err
	}
	// Nothing runs there any more: what is left is the pool's template
	// and empty service directories.
	if runtimeDir == "" {
		return nil
	}
	entries, err := os.ReadDir(runtimeDir)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(runtimeDir, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(runtimeDir, e.Name()), err)
		}
	}
	// The storage image (--storage-image-gib, made by default on ext4)
	// holds nothing more.
	if removed, err := local.RemoveStorageImage(ctx, runtimeDir); err != nil {
		return err
	} else if removed {
		fmt.Fprintf(stdout, "removed the storage image %s.img\n", runtimeDir)
	}
	if err := os.Remove(runtimeDir); err != nil && !os.IsNotExist(err) {
		// Another filesystem is mounted there.
		fmt.Fprintf(stdout, "emptied %s; it is a mount point (unmount it, then remove it and %s.img): %v\n", runtimeDir, runtimeDir, err)
		return nil
	}
	fmt.Fprintf(stdout, "removed %s\n", runtimeDir)
	return nil
}

type serviceSummary struct {
	ID               string `json:"id"`
	Name             string `json:"name"`
	Status           string `json:"status"`
	Reason           string `json:"status_reason,omitempty"`
	CPUMillis        string `json:"cpu_millis"`
	MemoryGBs        string `json:"memory_gbs"`
	Environment      string `json:"environment"`
	Replicas         int    `json:"ha_replicas"`
	Endpoint         string `json:"endpoint"`
	Pooler           string `json:"pooler_endpoint,omitempty"`
	ConnectionString string `json:"connection_string"`
}

func (a *adminCommand) summary(s *dbcloud.Service) serviceSummary {
	out := serviceSummary{
		ID: s.ID, Name: s.Name, Status: string(s.Status), Reason: s.StatusReason,
		Environment: string(s.Spec.Environment), Replicas: s.Spec.Replicas,
	}
	out.CPUMillis, out.MemoryGBs, _ = strings.Cut(s.Spec.Size.String(), "/")
	if s.Endpoint != nil {
		out.Endpoint = net.JoinHostPort(s.Endpoint.Host, strconv.Itoa(s.Endpoint.Port))
		// Slashes stay readable: libpq takes them unescaped in a query.
		ca := strings.ReplaceAll(url.QueryEscape(a.caFile()), "%2F", "/")
		out.ConnectionString = "postgresql://tsdbadmin@" + out.Endpoint + "/tsdb?sslmode=verify-full&sslrootcert=" + ca
	}
	if s.PoolerEndpoint != nil {
		out.Pooler = net.JoinHostPort(s.PoolerEndpoint.Host, strconv.Itoa(s.PoolerEndpoint.Port))
	}
	return out
}

// caFile is the CA that services' certificates chain to: the one named in
// bootstrap.json, else the one dbcloud serve makes in the data directory
// (without --ca-dir).
func (a *adminCommand) caFile() string {
	if b, ok := a.bootstrap(); ok && b.CAFile != "" {
		return b.CAFile
	}
	p, err := filepath.Abs(filepath.Join(a.dataDir, "tls", tlsca.CAFile))
	if err != nil {
		return filepath.Join(a.dataDir, "tls", tlsca.CAFile)
	}
	return p
}

// bootstrap reads the data directory's bootstrap.json, if there is one.
func (a *adminCommand) bootstrap() (bootstrapFile, bool) {
	var b bootstrapFile
	raw, err := os.ReadFile(filepath.Join(a.dataDir, "bootstrap.json"))
	return b, err == nil && json.Unmarshal(raw, &b) == nil
}

// serverRunning reports whether dbcloud serve answers on the data
// directory's API address (from bootstrap.json, else the default).
func (a *adminCommand) serverRunning() (string, bool) {
	addr := DefaultConfig().Listen
	if b, ok := a.bootstrap(); ok {
		if u, err := url.Parse(b.APIURL); err == nil && u.Host != "" {
			addr = u.Host
		}
	}
	// A whole TLS handshake, so the server logs no aborted one. Nothing
	// is sent over it: whether the certificate verifies does not matter
	// for telling whether something answers there.
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		var tcp net.Conn
		if tcp, err = net.DialTimeout("tcp", addr, time.Second); err != nil {
			return addr, false
		}
		tcp.Close() // something else listens there: not ours to stop
		return addr, true
	}
	c.Close()
	return addr, true
}

// drive asks for a change (start, returning how many resources it
// touched), then waits until done says the engine made it real. When no
// dbcloud serve runs on the data directory, it runs the engine itself
// meanwhile, on the same leases serve's engine takes, with no pool of
// prepared clusters and no snapshots; then each finish runs on it, once
// done (never when serve runs: the runtime is serve's).
func (a *adminCommand) drive(ctx context.Context, stderr io.Writer, start func(*cloud.Cloud) (int, error),
	done func(*cloud.Cloud) (bool, string, error), report func(int), finish ...func(m *Main) error) error {
	c, closeStore, err := a.open(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	n, err := start(c)
	if err != nil {
		return err
	}
	var m *Main
	if _, up := a.serverRunning(); !up {
		// serve's configuration (its DBCLOUD_* variables too) on this
		// data directory, so the runtime and the leases are serve's.
		m = NewMain(stderr)
		if err := m.ParseFlags([]string{"--data-dir", a.dataDir, "--store", a.store}); err != nil {
			return err
		}
		m.Config.PoolSize = 0
		m.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		if _, err := m.openControlPlane(ctx); err != nil {
			m.Close()
			return err
		}
		m.engine.BackupInterval = 0
		if err := m.engine.Open(); err != nil {
			m.Close()
			return err
		}
		defer m.Close()
	}
	for last := ""; ; {
		ok, state, err := done(c)
		if err != nil {
			return err
		}
		if ok {
			// What finishes the job on this host's runtime, which only a
			// command that opened it (serve is not running) can do.
			for _, f := range finish {
				if m == nil {
					break
				}
				if err := f(m); err != nil {
					return err
				}
			}
			report(n)
			return nil
		}
		if state != last {
			fmt.Fprintln(stderr, state)
			last = state
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted with %s; run the command again to finish", state)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
