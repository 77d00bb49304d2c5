package cloud

import (
	"context"
	"fmt"
	"slices"

	"dbcloud"
)

// ServiceView is a service as the API shows it: with its read replica sets,
// and with the password only in the response that created it.
type ServiceView struct {
	Service     *dbcloud.Service
	ReplicaSets []*dbcloud.ReadReplicaSet
	// InitialPassword is set only in the create and fork responses.
	InitialPassword string
	// StandbyOf names the parent when the view is of a read replica set.
	StandbyOf string
}

// ServiceCreate is a create-service request. Empty strings mean "not given".
type ServiceCreate struct {
	Name        string
	Addons      []string
	CPUMillis   string
	MemoryGBs   string
	Environment string
	Region      string
	Replicas    *int
	// PGVersion is the PostgreSQL major version asked for; nil: the
	// newest the installation runs.
	PGVersion *int
}

// HAChange is a setHA request; nil fields keep their current value.
type HAChange struct {
	Replicas     *int
	SyncReplicas *int
}

// ListServices lists the project's services (read replica sets are not
// services in the list, though GET answers for them).
func (c *Cloud) ListServices(ctx context.Context, projectID string) ([]*ServiceView, error) {
	var out []*ServiceView
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		svcs, err := tx.ListServices(projectID)
		if err != nil {
			return err
		}
		sets, err := tx.ListReplicaSets(projectID, "")
		if err != nil {
			return err
		}
		bySvc := make(map[string][]*dbcloud.ReadReplicaSet)
		for _, r := range sets {
			bySvc[r.ServiceID] = append(bySvc[r.ServiceID], r)
		}
		out = make([]*ServiceView, len(svcs))
		for i, s := range svcs {
			out[i] = &ServiceView{Service: s, ReplicaSets: bySvc[s.ID]}
		}
		return nil
	})
	return out, err
}

// ServicesRevision returns the change counter of the project's services
// and read replica sets (RevisionServices), after authorising the caller
// to read them, so that a transport may answer from what it read and
// encoded before, at the same counter, instead of reading it again. ok is
// false when the store keeps no counters: then nothing may be kept.
//
// Read the counter before what it covers: a write that lands in between is
// then in what was read, but the counter read is older, so what is kept
// is merely thrown away once too often, never answered stale.
func (c *Cloud) ServicesRevision(ctx context.Context, projectID string) (rev int64, ok bool, err error) {
	if err := c.authorize(ctx, projectID); err != nil {
		return 0, false, err
	}
	return c.revision(ctx, dbcloud.RevisionServices(projectID))
}

// ServiceRevisions is ServicesRevision for GetService of id: the
// project's counter, and the counter of id's own service and read replica
// sets (RevisionService), which a view of a service may be kept under
// instead. A read replica set's view also shows its parent, which the
// caller cannot know before reading it: that one is kept under the
// project's counter.
func (c *Cloud) ServiceRevisions(ctx context.Context, projectID, id string) (project, own int64, ok bool, err error) {
	if err := c.authorize(ctx, projectID); err != nil {
		return 0, 0, false, err
	}
	if project, ok, err = c.revision(ctx, dbcloud.RevisionServices(projectID)); err != nil || !ok {
		return 0, 0, ok, err
	}
	own, ok, err = c.revision(ctx, dbcloud.RevisionService(projectID, id))
	return project, own, ok, err
}

// GetService returns a service, or a read replica set shown as a service.
func (c *Cloud) GetService(ctx context.Context, projectID, id string) (*ServiceView, error) {
	var v *ServiceView
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		v, err = findServiceView(tx, projectID, id)
		return err
	})
	return v, err
}

// RenameService gives the service a new name (decisions.md section 1: the
// original's clients call it beyond the API document). A name is only a
// label: it changes nothing that runs, so no operation is recorded, and it
// is allowed in every state but DELETING.
func (c *Cloud) RenameService(ctx context.Context, projectID, id, name string) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	var v *ServiceView
	err = c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		s, err := findService(tx, projectID, id)
		if err != nil {
			return err
		}
		if s.Status == dbcloud.StatusDeleting {
			return dbcloud.Errorf(dbcloud.KindConflict, "Service %s is being deleted.", id)
		}
		s.Name = name
		if err := tx.UpdateService(s); err != nil {
			return err
		}
		v, err = findServiceView(tx, projectID, id)
		return err
	})
	return v, err
}

func findServiceView(tx dbcloud.Tx, projectID, id string) (*ServiceView, error) {
	s, err := findService(tx, projectID, id)
	if err == nil {
		sets, err := tx.ListReplicaSets(projectID, s.ID)
		if err != nil {
			return nil, err
		}
		return &ServiceView{Service: s, ReplicaSets: sets}, nil
	}
	if !dbcloud.IsNotFound(err) {
		return nil, err
	}
	r, rerr := tx.FindReplicaSet(projectID, id)
	if dbcloud.IsNotFound(rerr) {
		return nil, err
	} else if rerr != nil {
		return nil, rerr
	}
	parent, perr := findService(tx, projectID, r.ServiceID)
	if perr != nil {
		return nil, fmt.Errorf("parent of replica set %s: %w", r.ID, perr)
	}
	return &ServiceView{Service: r.AsService(parent), StandbyOf: parent.ID}, nil
}

func findService(tx dbcloud.Tx, projectID, id string) (*dbcloud.Service, error) {
	s, err := tx.FindService(projectID, id)
	if dbcloud.IsNotFound(err) {
		return nil, dbcloud.Errorf(dbcloud.KindNotFound, "Service %q not found.", id)
	}
	return s, err
}

// CreateService records a new service and the operation that provisions it.
func (c *Cloud) CreateService(ctx context.Context, projectID string, in ServiceCreate) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	var err error
	if in.Name, err = dbcloud.NormalName("name", in.Name); err != nil {
		return nil, err
	}
	version, err := dbcloud.ChoosePGVersion(in.PGVersion, c.Runtime.PGVersions())
	if err != nil {
		return nil, err
	}
	addons, err := c.parseAddons(in.Addons, version)
	if err != nil {
		return nil, err
	}
	size, err := c.Config.Sizes.Resolve(in.CPUMillis, in.MemoryGBs, dbcloud.DefaultSize)
	if err != nil {
		return nil, err
	}
	env := dbcloud.EnvDev
	if in.Environment != "" {
		if env, err = dbcloud.ParseEnvironment("environment_tag", in.Environment); err != nil {
			return nil, err
		}
	}
	region, err := c.resolveRegion(in.Region)
	if err != nil {
		return nil, err
	}
	replicas := 0
	if in.Replicas != nil {
		replicas = *in.Replicas
	}
	if err := c.checkHA(replicas, 0); err != nil {
		return nil, err
	}
	password := dbcloud.NewPassword()
	svc := &dbcloud.Service{
		ID: dbcloud.NewID(), ProjectID: projectID, Name: in.Name, Region: region, Type: dbcloud.ServiceTypeFor(addons),
		Spec: dbcloud.ServiceSpec{
			Size: size, Addons: addons, Environment: env, Replicas: replicas, Running: true,
			PGVersion: version.Major,
		},
		PGVersionFull:    version.Full,
		PasswordVerifier: dbcloud.NewSCRAMVerifier(password),
	}
	if err := c.insertService(ctx, svc, password, 0, dbcloud.OpCreateService); err != nil {
		return nil, err
	}
	return &ServiceView{Service: svc, InitialPassword: password}, nil
}

// insertService records a new service with its endpoint and first
// operation, and seals its password into the request's idempotency record
// in the same transaction. storageMB is the data it starts with (a fork's
// copy of its parent), for admission.
func (c *Cloud) insertService(ctx context.Context, svc *dbcloud.Service, password string, storageMB int64, op dbcloud.OperationType) error {
	host, err := c.hostCapacity()
	if err != nil {
		return err
	}
	return c.withFreePorts(ctx, func(ports []int) error {
		return c.update(ctx, svc.ProjectID, func(tx dbcloud.Tx) error {
			existing, err := tx.ListServices(svc.ProjectID)
			if err != nil {
				return err
			}
			if len(existing) >= c.Config.Quotas.Services {
				return quotaError("The project already has %d services; the limit is %d.", len(existing), c.Config.Quotas.Services)
			}
			svc.Created = c.now()
			svc.Generation = 1
			dbcloud.Create.Apply(svc)
			if err := c.admit(tx, host, svc.ProjectID, candidate{services: []*dbcloud.Service{svc}, size: svc.Spec.Size, storageMB: storageMB}); err != nil {
				return err
			}
			if svc.Endpoint, err = c.claimEndpoint(tx, svc.ID, ports); err != nil {
				return err
			}
			if err := tx.InsertService(svc); err != nil {
				return err
			}
			claim(ctx, "service", svc.ID)
			if r := idempotencyFromContext(ctx); r != nil && r.Seal != nil {
				if r.Secret, err = r.Seal([]byte(password)); err != nil {
					return fmt.Errorf("seal the initial password: %w", err)
				}
			}
			return c.insertOperation(ctx, tx, svc.ProjectID, svc.ID, op, svc.Generation)
		})
	})
}

// parseAddons validates the addons asked for a service on version, whose
// installation must have each addon's extension.
func (c *Cloud) parseAddons(names []string, version dbcloud.PGVersion) ([]dbcloud.Addon, error) {
	var out []dbcloud.Addon
	avail := version.Extensions
	for _, n := range names {
		a := dbcloud.Addon(n)
		if a != dbcloud.AddonTimeSeries && a != dbcloud.AddonAI {
			return nil, dbcloud.Errorf(dbcloud.KindInvalid, "addons: %q is not an addon; allowed: time-series, ai.", n)
		}
		if slices.Contains(out, a) {
			continue
		}
		if !avail[a.Extension()] {
			return nil, dbcloud.CodedErrorf(dbcloud.KindInvalid, dbcloud.CodeAddonUnavailable,
				"addon %q needs the PostgreSQL extension %q, which this server's PostgreSQL %d does not have.", a, a.Extension(), version.Major)
		}
		out = append(out, a)
	}
	return out, nil
}

// checkHA applies the HA rules of decisions.md section 3. Any environment
// may have HA (section 5).
func (c *Cloud) checkHA(replicas, sync int) error {
	if replicas < 0 || sync < 0 {
		return dbcloud.Errorf(dbcloud.KindInvalid, "replica_count and sync_replica_count must be 0 or more.")
	}
	if replicas > c.Config.Quotas.MaxHAReplicas {
		return quotaError("replica_count %d is over the limit of %d HA replicas.", replicas, c.Config.Quotas.MaxHAReplicas)
	}
	if sync > replicas {
		return quotaError("sync_replica_count %d is over replica_count %d; it can be at most replica_count.", sync, replicas)
	}
	return nil
}

// DeleteService marks the service for deletion. Delete supersedes any
// operation in flight; a PROD service is protected until it is set to DEV.
func (c *Cloud) DeleteService(ctx context.Context, projectID, id string) error {
	_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Status == dbcloud.StatusDeleting {
			return "", nil
		}
		if s.Spec.Environment == dbcloud.EnvProd {
			return "", dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeDeleteProtected,
				"Service %s is PROD and delete-protected; set its environment to DEV first.", s.ID)
		}
		// A fork still being made reads this service's snapshots and WAL.
		if f, err := copyingFork(tx, s); err != nil || f != nil {
			if err != nil {
				return "", err
			}
			return "", dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Fork %s is still copying this service's data; delete it when the fork is READY, or delete the fork first.", f.ID)
		}
		if err := c.supersedePending(tx, s.ID); err != nil {
			return "", err
		}
		dbcloud.Delete.Apply(s)
		return dbcloud.OpDeleteService, nil
	})
	return err
}

// StartService starts a stopped service; starting a running one is a no-op.
func (c *Cloud) StartService(ctx context.Context, projectID, id string) (*ServiceView, error) {
	host, err := c.hostCapacity()
	if err != nil {
		return nil, err
	}
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.Running && s.Status != dbcloud.StatusDeleting {
			return "", nil
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := dbcloud.Start.Check(s); err != nil {
			return "", err
		}
		if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Running = true }); err != nil {
			return "", err
		}
		s.Spec.Running, s.PausedAt = true, nil
		dbcloud.Start.Apply(s)
		return dbcloud.OpStartService, nil
	})
}

// StopService stops a running service, keeping its data.
func (c *Cloud) StopService(ctx context.Context, projectID, id string) (*ServiceView, error) {
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.AutoPaused() && s.Status == dbcloud.StatusPaused {
			// Stopped now, not auto-paused: connections no longer wake
			// it, and the runtime lets its endpoints go.
			if err := busy(tx, s); err != nil {
				return "", err
			}
			s.PausedAt = nil
			dbcloud.Stop.Apply(s)
			return dbcloud.OpStopService, nil
		}
		if !s.Spec.Running && s.Status != dbcloud.StatusDeleting {
			return "", nil
		}
		superseded, err := c.correct(tx, s)
		if err != nil {
			return "", err
		}
		if err := correction(dbcloud.Stop, s, superseded); err != nil {
			return "", err
		}
		// A NOW fork copies the running service: stopped, it could never
		// be made. Forks from snapshots read files, which stay.
		if f, err := copyingFork(tx, s, dbcloud.ForkNow); err != nil || f != nil {
			if err != nil {
				return "", err
			}
			return "", dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Fork %s is still copying this service's running data; stop it when the fork is READY, or delete the fork first.", f.ID)
		}
		s.Spec.Running = false
		dbcloud.Stop.Apply(s)
		return dbcloud.OpStopService, nil
	})
}

// ResizeService changes a service's size. A PAUSED service takes the new
// size at its next start.
func (c *Cloud) ResizeService(ctx context.Context, projectID, id, cpu, mem string) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	if cpu == "" || mem == "" {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "cpu_millis and memory_gbs are both required.")
	}
	size, err := c.Config.Sizes.Resolve(cpu, mem, dbcloud.Size{})
	if err != nil {
		return nil, err
	}
	host, err := c.hostCapacity()
	if err != nil {
		return nil, err
	}
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		// Only a settled size is "in effect" (decisions.md section 6): the
		// same size asked again while a change is in flight is refused.
		if s.Spec.Size == size && s.Status != dbcloud.StatusDeleting && busy(tx, s) == nil {
			return "", nil
		}
		superseded, err := c.correct(tx, s)
		if err != nil {
			return "", err
		}
		if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Size = size }); err != nil {
			return "", err
		}
		if s.Status == dbcloud.StatusPaused {
			s.Spec.Size = size
			s.Generation++
			return "", nil
		}
		if err := correction(dbcloud.Resize, s, superseded); err != nil {
			return "", err
		}
		s.Spec.Size = size
		dbcloud.Resize.Apply(s)
		return dbcloud.OpResizeService, nil
	})
}

// SetHA changes the number of HA replicas and how many are synchronous.
func (c *Cloud) SetHA(ctx context.Context, projectID, id string, in HAChange) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	if in.Replicas == nil && in.SyncReplicas == nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "Give replica_count, sync_replica_count or both.")
	}
	host, err := c.hostCapacity()
	if err != nil {
		return nil, err
	}
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		replicas, sync := s.Spec.Replicas, s.Spec.SyncReplicas
		if in.Replicas != nil {
			replicas = *in.Replicas
			sync = min(sync, max(replicas, 0))
		}
		if in.SyncReplicas != nil {
			sync = *in.SyncReplicas
		}
		if err := c.checkHA(replicas, sync); err != nil {
			return "", err
		}
		if replicas > 0 {
			if err := noAutoPause(s, "setHA"); err != nil {
				return "", err
			}
		}
		if replicas == s.Spec.Replicas && sync == s.Spec.SyncReplicas && s.Status != dbcloud.StatusDeleting && busy(tx, s) == nil {
			return "", nil
		}
		// Fewer standbys is a correction; more is growth and waits.
		move := dbcloud.ShrinkHA
		if replicas <= s.Spec.Replicas {
			superseded, err := c.correct(tx, s)
			if err != nil {
				return "", err
			}
			if err := correction(move, s, superseded); err != nil {
				return "", err
			}
		} else {
			move = dbcloud.GrowHA
			if err := busy(tx, s); err != nil {
				return "", err
			}
			if err := move.Check(s); err != nil {
				return "", err
			}
			if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Replicas = replicas }); err != nil {
				return "", err
			}
		}
		s.Spec.Replicas, s.Spec.SyncReplicas = replicas, sync
		move.Apply(s)
		return move.Op, nil
	})
}

// SetPooler enables or disables the service's connection pooler. Any
// environment may have one (decisions.md section 5). While the change is
// made the service shows CONFIGURING, so that a client sees why another
// change would wait. Disabling is a correction: it is accepted on an
// UNSTABLE service and supersedes a failing enable.
func (c *Cloud) SetPooler(ctx context.Context, projectID, id string, enabled bool) (string, error) {
	msg := "Connection pooler disabled."
	if enabled {
		msg = "Connection pooler enabled; its endpoint appears once it accepts connections."
	}
	withPorts := c.withFreePorts
	if !enabled {
		withPorts = func(_ context.Context, fn func([]int) error) error { return fn(nil) }
	}
	err := withPorts(ctx, func(ports []int) error {
		_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
			if s.Spec.Pooler == enabled && s.Status != dbcloud.StatusDeleting {
				// Already asked for: by this request itself when it is a
				// retry whose first try was applied but never answered
				// (dbcloud stopped in between), so the answer is the
				// first try's, not a refusal for its own operation.
				inFlight, err := onlyPending(tx, s, dbcloud.OpSetPooler)
				if err != nil {
					return "", err
				}
				if inFlight || busy(tx, s) == nil {
					return "", nil
				}
			}
			superseded := false
			if enabled {
				if err := busy(tx, s); err != nil {
					return "", err
				}
			} else {
				var err error
				if superseded, err = c.correct(tx, s); err != nil {
					return "", err
				}
			}
			if enabled && s.PoolerPort == 0 {
				// Claimed once, in the same table as endpoint ports, and
				// released with them when the service is deleted.
				ep, err := c.claimEndpoint(tx, s.ID, ports)
				if err != nil {
					return "", err
				}
				s.PoolerPort = ep.Port
			}
			s.Spec.Pooler = enabled
			if s.Status == dbcloud.StatusPaused {
				s.Generation++
				return "", nil
			}
			move := dbcloud.DisablePooler
			if enabled {
				move = dbcloud.EnablePooler
			}
			if err := correction(move, s, superseded); err != nil {
				return "", err
			}
			move.Apply(s)
			return move.Op, nil
		})
		return err
	})
	return msg, err
}

// SetEnvironment changes the environment tag and with it the delete
// protection. It never removes anything: HA, a pooler and read replica
// sets are allowed on DEV too (decisions.md section 5).
func (c *Cloud) SetEnvironment(ctx context.Context, projectID, id, env string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	e, err := dbcloud.ParseEnvironment("environment", env)
	if err != nil {
		return "", err
	}
	_, err = c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.Environment == e {
			return "", nil
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		s.Spec.Environment = e
		return "", nil
	})
	return fmt.Sprintf("Environment set to %s.", e), err
}
