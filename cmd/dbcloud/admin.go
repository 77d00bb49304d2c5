package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"dbcloud/cloud"

	"dbcloud/identity"
)

// adminCommand holds what every admin subcommand takes.
type adminCommand struct {
	dataDir, store, adminName, adminEmail string
	json                                  bool
}

func (a *adminCommand) flags(fs *flag.FlagSet) {
	d := DefaultConfig()
	fs.StringVar(&a.dataDir, "data-dir", d.DataDir, "data directory of the server")
	fs.StringVar(&a.store, "store", "", "store: empty for SQLite in the data directory, or a postgres:// URL")
	fs.StringVar(&a.adminName, "admin-name", d.AdminName, "name of the admin user created with the store")
	fs.StringVar(&a.adminEmail, "admin-email", d.AdminEmail, "e-mail of the admin user created with the store")
	fs.BoolVar(&a.json, "json", false, "print JSON")
}

// open returns a Cloud on the store for admin work; it needs no runtime.
func (a *adminCommand) open(ctx context.Context) (*cloud.Cloud, func() error, error) {
	s, err := openStore(ctx, a.dataDir, a.store)
	if err != nil {
		return nil, nil, err
	}
	// Admin work is projects and keys only: no runtime is involved.
	c := cloud.New(s, nil, cloud.DefaultConfig(), slog.New(slog.DiscardHandler))
	return c, s.Close, nil
}

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) >= 1 && args[0] == "teardown" {
		return runTeardown(ctx, args[1:], stdout, stderr)
	}
	if len(args) >= 2 && args[0] == "service" {
		return runAdminService(ctx, args[1], args[2:], stdout, stderr)
	}
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return errors.New("admin: want a subject and a verb, such as `admin project create`")
	}
	var a adminCommand
	name := "dbcloud admin " + args[0] + " " + args[1]
	switch args[0] + " " + args[1] {
	case "project create":
		var projectName string
		fs := newFlagSet(name, "Create a project; prints its id and name.", stderr)
		a.flags(fs)
		fs.StringVar(&projectName, "name", "", "project name (required)")
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		if projectName == "" {
			return errors.New("--name is required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			p, err := c.CreateProject(ctx, projectName, a.adminName, a.adminEmail)
			if err != nil {
				return err
			}
			return a.print(stdout, map[string]string{"id": p.ID, "name": p.Name}, "%s\t%s\n", p.ID, p.Name)
		})
	case "project list":
		fs := newFlagSet(name, "List every project.", stderr)
		a.flags(fs)
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			ps, err := c.ListProjectsAdmin(ctx)
			if err != nil {
				return err
			}
			out := make([]map[string]string, len(ps))
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			for i, p := range ps {
				out[i] = map[string]string{"id": p.ID, "name": p.Name}
				if !a.json {
					fmt.Fprintf(tw, "%s\t%s\n", p.ID, p.Name)
				}
			}
			if a.json {
				return json.NewEncoder(stdout).Encode(out)
			}
			return tw.Flush()
		})
	case "project set-quota":
		var project string
		var reset bool
		q := cloud.DefaultConfig().Quotas.Resources
		fs := newFlagSet(name, "Give a project its own resource quota (what its running instances may reserve); lowering it removes nothing.", stderr)
		a.flags(fs)
		fs.StringVar(&project, "project", "", "project ID (required)")
		fs.IntVar(&q.Instances, "instances", q.Instances, "running instances: primaries, HA standbys and read replica nodes (0: no limit)")
		fs.IntVar(&q.CPUMillis, "cpu-millis", q.CPUMillis, "millicores over all running instances (0: no limit)")
		fs.IntVar(&q.MemoryGBs, "memory-gbs", q.MemoryGBs, "GiB of memory over all running instances (0: no limit)")
		fs.IntVar(&q.StorageGBs, "storage-gbs", q.StorageGBs, "GiB of measured storage over all instances (0: no limit)")
		fs.BoolVar(&reset, "default", false, "return the project to the server's default quota (--quota-* flags of serve)")
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		if project == "" {
			return errors.New("--project is required")
		}
		quota := &q
		if reset {
			quota = nil
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			p, err := c.SetProjectQuota(ctx, project, quota)
			if err != nil {
				return err
			}
			out := map[string]any{"id": p.ID, "resource_quota": p.Quota}
			if p.Quota == nil {
				return a.print(stdout, out, "%s\tdefault quota\n", p.ID)
			}
			return a.print(stdout, out, "%s\tinstances %d, cpu_millis %d, memory_gbs %d, storage_gbs %d\n",
				p.ID, q.Instances, q.CPUMillis, q.MemoryGBs, q.StorageGBs)
		})
	case "key create":
		var project, keyName string
		fs := newFlagSet(name, "Issue an API key for a project. The secret is shown once.", stderr)
		a.flags(fs)
		fs.StringVar(&project, "project", "", "project ID (required)")
		fs.StringVar(&keyName, "name", "", "key name (required)")
		role := fs.String("role", "owner", "what the key may do: viewer, developer, admin or owner (docs/roles.md)")
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		if project == "" || keyName == "" {
			return errors.New("--project and --name are required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			k, err := c.CreateAPIKeyWithRole(ctx, project, keyName, identity.Role(*role), a.adminName, a.adminEmail)
			if err != nil {
				return err
			}
			return a.print(stdout, k, "access_key: %s\nsecret_key: %s\nproject_id: %s\n", k.AccessKey, k.SecretKey, k.ProjectID)
		})
	case "key list":
		var project string
		fs := newFlagSet(name, "List a project's API keys (never their secrets).", stderr)
		a.flags(fs)
		fs.StringVar(&project, "project", "", "project ID (required)")
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		if project == "" {
			return errors.New("--project is required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			ks, err := c.ListAPIKeys(ctx, project)
			if err != nil {
				return err
			}
			if a.json {
				return json.NewEncoder(stdout).Encode(ks)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ACCESS KEY\tNAME\tROLE\tCREATED\tREVOKED")
			for _, k := range ks {
				revoked := "-"
				if k.Revoked != nil {
					revoked = k.Revoked.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.AccessKey, k.Name, k.Role, k.Created.Format(time.RFC3339), revoked)
			}
			return tw.Flush()
		})
	case "key revoke":
		var access string
		fs := newFlagSet(name, "Revoke an API key; its next request answers 401.", stderr)
		a.flags(fs)
		fs.StringVar(&access, "access-key", "", "access key to revoke (required)")
		if err := parseFlags(fs, args[2:]); err != nil {
			return err
		}
		if access == "" {
			return errors.New("--access-key is required")
		}
		return a.run(ctx, func(c *cloud.Cloud) error {
			if err := c.RevokeAPIKey(ctx, access); err != nil {
				return err
			}
			return a.print(stdout, map[string]string{"access_key": access, "status": "revoked"}, "revoked %s\n", access)
		})
	}
	if args[0] == "user" {
		return runAdminUser(ctx, name, args[1], args[2:], os.Stdin, stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown admin command %q", args[0]+" "+args[1])
}

func (a *adminCommand) run(ctx context.Context, fn func(*cloud.Cloud) error) error {
	c, closeStore, err := a.open(ctx)
	if err != nil {
		return err
	}
	err = fn(c)
	return errors.Join(err, closeStore())
}

func (a *adminCommand) print(w io.Writer, v any, format string, args ...any) error {
	if a.json {
		return json.NewEncoder(w).Encode(v)
	}
	_, err := fmt.Fprintf(w, format, args...)
	return err
}
