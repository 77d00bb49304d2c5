package cloud

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

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
}

// ServiceFork is a fork request. Empty strings mean "not given".
type ServiceFork struct {
	Strategy    string
	Name        *string
	CPUMillis   string
	MemoryGBs   string
	Environment string
	TargetTime  *time.Time
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
	if err := dbcloud.ValidateName("name", name); err != nil {
		return nil, err
	}
	var v *ServiceView
	err := c.update(ctx, projectID, func(tx dbcloud.Tx) error {
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
	if err := dbcloud.ValidateName("name", in.Name); err != nil {
		return nil, err
	}
	addons, err := c.parseAddons(in.Addons)
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
		},
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
			svc.Status = dbcloud.StatusQueued
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

func (c *Cloud) parseAddons(names []string) ([]dbcloud.Addon, error) {
	var out []dbcloud.Addon
	avail := c.Runtime.Extensions()
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
				"addon %q needs the PostgreSQL extension %q, which this server's PostgreSQL does not have.", a, a.Extension())
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

// ForkService records a new service that will hold the parent's data.
func (c *Cloud) ForkService(ctx context.Context, projectID, parentID string, in ServiceFork) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	strategy := dbcloud.ForkStrategy(in.Strategy)
	switch strategy {
	case dbcloud.ForkLastSnapshot, dbcloud.ForkNow, dbcloud.ForkPITR:
	case "":
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "fork_strategy is required: LAST_SNAPSHOT, NOW or PITR.")
	default:
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "fork_strategy %q is unknown; allowed: LAST_SNAPSHOT, NOW, PITR.", in.Strategy)
	}
	if strategy == dbcloud.ForkPITR && in.TargetTime == nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "target_time is required with fork_strategy PITR.")
	}
	if strategy != dbcloud.ForkPITR && in.TargetTime != nil {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "target_time is only allowed with fork_strategy PITR.")
	}
	env := dbcloud.EnvDev
	if in.Environment != "" {
		var err error
		if env, err = dbcloud.ParseEnvironment("environment_tag", in.Environment); err != nil {
			return nil, err
		}
	}
	var parent *dbcloud.Service
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		parent, err = findService(tx, projectID, parentID)
		return err
	})
	if err != nil {
		return nil, err
	}
	switch {
	case parent.Status == dbcloud.StatusReady:
	case parent.Status == dbcloud.StatusPaused && strategy != dbcloud.ForkNow:
	case parent.Status == dbcloud.StatusPaused:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "Service %s is PAUSED; fork it with LAST_SNAPSHOT or PITR, or start it for NOW.", parent.ID)
	default:
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; it can be forked when READY or PAUSED.", parent.ID, parent.Status)
	}
	if err := c.checkForkSource(ctx, parent, strategy, in.TargetTime); err != nil {
		return nil, err
	}
	size, err := c.Config.Sizes.Resolve(in.CPUMillis, in.MemoryGBs, parent.Spec.Size)
	if err != nil {
		return nil, err
	}
	name := parent.Name + "-fork"
	if in.Name != nil {
		name = *in.Name
		if err := dbcloud.ValidateName("name", name); err != nil {
			return nil, err
		}
	}
	if len([]rune(name)) > 128 {
		name = string([]rune(name)[:128])
	}
	password := dbcloud.NewPassword()
	svc := &dbcloud.Service{
		ID: dbcloud.NewID(), ProjectID: projectID, Name: name, Region: parent.Region, Type: parent.Type,
		Spec: dbcloud.ServiceSpec{
			Size: size, Addons: slices.Clone(parent.Spec.Addons), Environment: env, Running: true,
		},
		Fork:             &dbcloud.ForkSource{ProjectID: projectID, ServiceID: parent.ID, Strategy: strategy, TargetTime: in.TargetTime},
		PasswordVerifier: dbcloud.NewSCRAMVerifier(password),
	}
	if err := c.insertService(ctx, svc, password, storageOf(parent), dbcloud.OpCreateService); err != nil {
		return nil, err
	}
	return &ServiceView{Service: svc, InitialPassword: password}, nil
}

// mutateService is the frame of every change to an existing service: it
// authorises, finds the service, refuses deleted or busy services, lets fn
// decide, and records fn's operation with the new generation.
//
// fn returns the operation to record, or "" when the change needs none (a
// repeat that is already in effect, or a change to a stopped service that
// takes effect at the next start).
func (c *Cloud) mutateService(ctx context.Context, projectID, id string, fn func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error)) (*ServiceView, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	var view *ServiceView
	err := c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		s, err := findService(tx, projectID, id)
		if err != nil {
			if dbcloud.IsNotFound(err) {
				if _, rerr := tx.FindReplicaSet(projectID, id); rerr == nil {
					return dbcloud.Errorf(dbcloud.KindConflict, "%q is a read replica set; use the replicaSets paths of its service to change it.", id)
				}
			}
			return err
		}
		before := *s
		op, err := fn(tx, s)
		if err != nil {
			return err
		}
		if op != "" {
			s.Generation++
			if err := c.insertOperation(ctx, tx, projectID, s.ID, op, s.Generation); err != nil {
				return err
			}
		}
		if op != "" || !sameService(&before, s) {
			if err := tx.UpdateService(s); err != nil {
				return err
			}
		}
		sets, err := tx.ListReplicaSets(projectID, s.ID)
		if err != nil {
			return err
		}
		view = &ServiceView{Service: s, ReplicaSets: sets}
		return nil
	})
	return view, err
}

// sameService reports whether a mutation left the stored fields unchanged.
func sameService(a, b *dbcloud.Service) bool {
	return a.Status == b.Status && a.Generation == b.Generation && a.Name == b.Name &&
		a.PasswordVerifier == b.PasswordVerifier && specEqual(a.Spec, b.Spec)
}

func specEqual(a, b dbcloud.ServiceSpec) bool {
	return a.Size == b.Size && slices.Equal(a.Addons, b.Addons) && a.Environment == b.Environment &&
		a.Replicas == b.Replicas && a.SyncReplicas == b.SyncReplicas && a.Pooler == b.Pooler &&
		a.VPCID == b.VPCID && a.Running == b.Running
}

// busy refuses a change while other work on the service is in flight
// (decisions.md section 6).
func busy(tx dbcloud.Tx, s *dbcloud.Service) error {
	if s.Status == dbcloud.StatusDeleting {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress, "Service %s is being deleted.", s.ID)
	}
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true, Limit: 1})
	if err != nil {
		return err
	}
	if len(pending) > 0 || s.Status.Transitional() {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
			"Service %s is %s with an operation in progress; retry when it is done.", s.ID, s.Status)
	}
	return nil
}

// onlyPending reports whether s has pending operations and all are of type t.
func onlyPending(tx dbcloud.Tx, s *dbcloud.Service, t dbcloud.OperationType) (bool, error) {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true})
	if err != nil || len(pending) == 0 {
		return false, err
	}
	for _, op := range pending {
		if op.Type != t {
			return false, nil
		}
	}
	return true, nil
}

// correct is busy for a correction: a change that repairs or shrinks
// (resize, stop, setHA down, disablePooler). On a service that is UNSTABLE,
// or whose pending work keeps failing, it supersedes that work instead of
// refusing, so that a user can always get out of a failure (issue 14). It
// reports whether it superseded anything.
func (c *Cloud) correct(tx dbcloud.Tx, s *dbcloud.Service) (bool, error) {
	if s.Status == dbcloud.StatusDeleting {
		return false, busy(tx, s)
	}
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: s.ID, Pending: true})
	if err != nil {
		return false, err
	}
	if len(pending) == 0 && !s.Status.Transitional() {
		return false, nil
	}
	failing := s.Status == dbcloud.StatusUnstable
	for _, op := range pending {
		failing = failing || op.Attempts > 0
	}
	if !failing {
		return false, busy(tx, s)
	}
	return true, c.supersede(tx, pending, "superseded by a newer request")
}

// needReady refuses changes that need the service running and healthy.
func needReady(s *dbcloud.Service, what string) error {
	if s.Status != dbcloud.StatusReady {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; %s needs it READY.", s.ID, s.Status, what)
	}
	return nil
}

// needRunning refuses corrections of a service that is not running: READY,
// UNSTABLE or being corrected (superseded work) are fine.
func needRunning(s *dbcloud.Service, superseded bool, what string) error {
	if s.Status != dbcloud.StatusReady && s.Status != dbcloud.StatusUnstable && !superseded {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; %s needs it READY or UNSTABLE.", s.ID, s.Status, what)
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
		s.Status = dbcloud.StatusDeleting
		return dbcloud.OpDeleteService, nil
	})
	return err
}

// copyingFork returns a fork of s that has not started yet, so still
// reads s's data, of one of the strategies given (any when none), or nil.
func copyingFork(tx dbcloud.Tx, s *dbcloud.Service, strategies ...dbcloud.ForkStrategy) (*dbcloud.Service, error) {
	svcs, err := tx.ListServices(s.ProjectID)
	if err != nil {
		return nil, err
	}
	for _, f := range svcs {
		if f.Fork != nil && f.Fork.ServiceID == s.ID && f.ObservedGeneration == 0 && f.Status != dbcloud.StatusDeleting &&
			(len(strategies) == 0 || slices.Contains(strategies, f.Fork.Strategy)) {
			return f, nil
		}
	}
	return nil, nil
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
		if s.Status != dbcloud.StatusPaused {
			return "", dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; only a PAUSED service can be started.", s.ID, s.Status)
		}
		if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Running = true }); err != nil {
			return "", err
		}
		s.Spec.Running = true
		s.Status = dbcloud.StatusResuming
		return dbcloud.OpStartService, nil
	})
}

// StopService stops a running service, keeping its data.
func (c *Cloud) StopService(ctx context.Context, projectID, id string) (*ServiceView, error) {
	return c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if !s.Spec.Running && s.Status != dbcloud.StatusDeleting {
			return "", nil
		}
		superseded, err := c.correct(tx, s)
		if err != nil {
			return "", err
		}
		if s.Status != dbcloud.StatusReady && s.Status != dbcloud.StatusUnstable && !superseded {
			return "", dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; only a READY or UNSTABLE service can be stopped.", s.ID, s.Status)
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
		s.Status = dbcloud.StatusPausing
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
		if err := needRunning(s, superseded, "resize"); err != nil {
			return "", err
		}
		s.Spec.Size = size
		s.Status = dbcloud.StatusConfiguring
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
		if replicas == s.Spec.Replicas && sync == s.Spec.SyncReplicas && s.Status != dbcloud.StatusDeleting && busy(tx, s) == nil {
			return "", nil
		}
		// Fewer standbys is a correction; more is growth and waits.
		superseded := false
		if replicas <= s.Spec.Replicas {
			if superseded, err = c.correct(tx, s); err != nil {
				return "", err
			}
			if err := needRunning(s, superseded, "setHA"); err != nil {
				return "", err
			}
		} else {
			if err := busy(tx, s); err != nil {
				return "", err
			}
			if err := needReady(s, "setHA"); err != nil {
				return "", err
			}
			if err := c.admitService(tx, host, s, func(n *dbcloud.Service) { n.Spec.Replicas = replicas }); err != nil {
				return "", err
			}
		}
		s.Spec.Replicas, s.Spec.SyncReplicas = replicas, sync
		s.Status = dbcloud.StatusConfiguring
		return dbcloud.OpSetHA, nil
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
			if enabled {
				if err := needReady(s, "enablePooler"); err != nil {
					return "", err
				}
			} else if err := needRunning(s, superseded, "disablePooler"); err != nil {
				return "", err
			}
			s.Status = dbcloud.StatusConfiguring
			return dbcloud.OpSetPooler, nil
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

// DefaultPasswordTimeout bounds an updatePassword's work on the tenant's
// database (Cloud.PasswordTimeout), so that a slow or locked tenant fails
// only its own request.
const DefaultPasswordTimeout = 10 * time.Second

// UpdatePassword sets tsdbadmin's password; it works before this returns,
// and the old one no longer does. The running service is changed first,
// outside any store transaction (a tenant may hold a lock on its role, and
// no other project may wait for that); then the verifier is recorded. A
// lease on the service keeps the engine and other password changes off it
// meanwhile; if dbcloud stops between the two steps, the request was never
// answered and the engine restores the recorded password.
func (c *Cloud) UpdatePassword(ctx context.Context, projectID, id, password string) error {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return err
	}
	if err := dbcloud.ValidatePassword(password); err != nil {
		return err
	}
	verifier := dbcloud.NewSCRAMVerifier(password)
	timeout := c.PasswordTimeout
	if timeout <= 0 {
		timeout = DefaultPasswordTimeout
	}
	// One budget bounds the whole request: the wait for the lease and the
	// work on the tenant's database.
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	owner := "password-" + dbcloud.NewID()
	svc, err := c.passwordLease(actx, projectID, id, owner, timeout)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
				"Service %s is being worked on (a repair or a snapshot) and was not free within %v; the password was not changed. Retry in a few seconds.", id, timeout)
		}
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.Store.Update(rctx, func(tx dbcloud.Tx) error { return tx.ReleaseLease(svc.ID, owner) }); err != nil {
			c.Logger.Warn("release password lease", "service", svc.ID, "error", err)
		}
	}()
	if err := c.Runtime.SetPassword(actx, svc, verifier); err != nil {
		if dbcloud.ErrorKindOf(err) != dbcloud.KindInternal {
			return err
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The tenant's database did not answer in time (overloaded by
			// its own sessions): its request fails, nobody waits longer.
			return dbcloud.Errorf(dbcloud.KindConflict, "Service %s did not take the new password within %v (its database is busy); the password was not changed. Retry when it is less loaded.", svc.ID, timeout)
		}
		return fmt.Errorf("set password of %s: %w", svc.ID, err)
	}
	_, err = c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		s.PasswordVerifier = verifier
		return "", nil
	})
	return err
}

// passwordLease takes the service's lease for a password change. A lease
// held by the engine's background work (a snapshot and its restore check,
// a repair, a usage write) is waited for until ctx ends: those finish on
// their own, and a caller who just saw READY must not be refused for
// work it never asked for. A pending operation or a service that is not
// READY is refused at once, since only the caller can change that.
func (c *Cloud) passwordLease(ctx context.Context, projectID, id, owner string, timeout time.Duration) (*dbcloud.Service, error) {
	const poll = 100 * time.Millisecond
	for {
		var svc *dbcloud.Service
		err := c.Store.Update(ctx, func(tx dbcloud.Tx) error {
			s, err := findService(tx, projectID, id)
			if err != nil {
				return err
			}
			if err := busy(tx, s); err != nil {
				return err
			}
			if err := needReady(s, "updatePassword"); err != nil {
				return err
			}
			now := c.now()
			ok, err := tx.AcquireLease(s.ID, owner, now, now.Add(timeout+5*time.Second))
			if ok {
				svc = s
			}
			return err
		})
		if err != nil && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil || svc != nil {
			return svc, err
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// AttachVPC attaches the service to a VPC of its project and region.
func (c *Cloud) AttachVPC(ctx context.Context, projectID, id, vpcID string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	if !dbcloud.IsNumericID(vpcID) {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q is not a VPC ID.", vpcID)
	}
	_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.VPCID == vpcID && s.Status != dbcloud.StatusDeleting {
			return "", nil
		}
		vpc, err := tx.FindVPC(projectID, vpcID)
		if dbcloud.IsNotFound(err) {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q does not name a VPC of this project.", vpcID)
		} else if err != nil {
			return "", err
		}
		if s.Spec.VPCID != "" {
			return "", dbcloud.Errorf(dbcloud.KindConflict, "Service %s is already attached to VPC %s; detach it first.", s.ID, s.Spec.VPCID)
		}
		if vpc.Region != s.Region {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "VPC %s is in region %s but service %s is in %s; they must be in the same region.", vpc.ID, vpc.Region, s.ID, s.Region)
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := needReady(s, "attachToVPC"); err != nil {
			return "", err
		}
		s.Spec.VPCID = vpcID
		s.Status = dbcloud.StatusConfiguring
		return dbcloud.OpAttachVPC, nil
	})
	return fmt.Sprintf("Service %s is being attached to VPC %s.", id, vpcID), err
}

// DetachVPC detaches the service from the VPC it is attached to.
func (c *Cloud) DetachVPC(ctx context.Context, projectID, id, vpcID string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	if !dbcloud.IsNumericID(vpcID) {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q is not a VPC ID.", vpcID)
	}
	_, err := c.mutateService(ctx, projectID, id, func(tx dbcloud.Tx, s *dbcloud.Service) (dbcloud.OperationType, error) {
		if s.Spec.VPCID == "" {
			if _, err := tx.FindVPC(projectID, vpcID); err != nil {
				if dbcloud.IsNotFound(err) {
					return "", dbcloud.Errorf(dbcloud.KindInvalid, "vpc_id %q does not name a VPC of this project.", vpcID)
				}
				return "", err
			}
			return "", nil // not attached: already in effect
		}
		if s.Spec.VPCID != vpcID {
			return "", dbcloud.Errorf(dbcloud.KindInvalid, "Service %s is attached to VPC %s, not %s.", s.ID, s.Spec.VPCID, vpcID)
		}
		if err := busy(tx, s); err != nil {
			return "", err
		}
		if err := needReady(s, "detachFromVPC"); err != nil {
			return "", err
		}
		s.Spec.VPCID = ""
		s.Status = dbcloud.StatusConfiguring
		return dbcloud.OpDetachVPC, nil
	})
	return fmt.Sprintf("Service %s is being detached from VPC %s.", id, vpcID), err
}

// admitService admits the service as change would leave it.
func (c *Cloud) admitService(tx dbcloud.Tx, host *dbcloud.HostCapacity, s *dbcloud.Service, change func(*dbcloud.Service)) error {
	n := *s
	change(&n)
	return c.admit(tx, host, s.ProjectID, candidate{services: []*dbcloud.Service{&n}, size: n.Spec.Size})
}

// supersedePending ends the resource's pending operations: a delete makes
// them moot, and the engine then works on the delete alone.
func (c *Cloud) supersedePending(tx dbcloud.Tx, resourceID string) error {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: resourceID, Pending: true})
	if err != nil {
		return err
	}
	return c.supersede(tx, pending, "superseded by delete")
}

func (c *Cloud) supersede(tx dbcloud.Tx, ops []*dbcloud.Operation, why string) error {
	for _, op := range ops {
		op.Finish(dbcloud.OpSuperseded, why, c.now())
		if err := tx.UpdateOperation(op); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cloud) insertOperation(ctx context.Context, tx dbcloud.Tx, projectID, resourceID string, t dbcloud.OperationType, gen int64) error {
	return c.insertChildOperation(ctx, tx, projectID, "", resourceID, t, gen)
}

// insertChildOperation records an operation on a resource that belongs to
// parentID (a read replica set's service, a peering's VPC), so that the
// parent's operation list shows it too.
func (c *Cloud) insertChildOperation(ctx context.Context, tx dbcloud.Tx, projectID, parentID, resourceID string, t dbcloud.OperationType, gen int64) error {
	now := c.now()
	op := &dbcloud.Operation{
		ID: dbcloud.NewID(), ProjectID: projectID, ParentID: parentID, ResourceID: resourceID, Type: t, Generation: gen,
		State: dbcloud.OpPending, Created: now, Updated: now, RequestedBy: requesterOf(ctx),
	}
	if err := tx.InsertOperation(op); err != nil {
		return fmt.Errorf("record %s operation of %s: %w", t, resourceID, err)
	}
	logOperation(ctx, op)
	c.Logger.Info("operation accepted", "operation", op.ID, "type", t, "resource", resourceID, "generation", gen)
	return nil
}

// portCandidates is how many free ports a request probes before its
// transaction; concurrent requests may take some of them first.
const portCandidates = 4

// portAttempts bounds how often a request probes again after concurrent
// requests took every port it probed.
const portAttempts = 8

// errPortsTaken says that every probed port was claimed by another request
// meanwhile; the request probes again.
var errPortsTaken = errors.New("every probed port was claimed meanwhile")

// withFreePorts runs fn with ports that no service holds and that nothing
// else on the host is bound to. Probing the host is I/O, so it happens
// before fn's store transaction, never inside it; fn claims the first that
// is still free (claimEndpoint).
func (c *Cloud) withFreePorts(ctx context.Context, fn func(ports []int) error) error {
	for attempt := 1; ; attempt++ {
		ports, err := c.freePorts(ctx)
		if err != nil {
			return err
		}
		err = fn(ports)
		if !errors.Is(err, errPortsTaken) {
			return err
		}
		if attempt == portAttempts {
			// Nothing was made; the caller can simply ask again.
			return dbcloud.Errorf(dbcloud.KindUnavailable, "Every free port this request probed was taken by concurrent requests; try again.")
		}
	}
}

// freePorts probes from a random place in the range, wrapping around, so
// that concurrent requests (on this plane or another) mostly probe
// different ports instead of all racing for the lowest free ones.
func (c *Cloud) freePorts(ctx context.Context) ([]int, error) {
	var used map[int]string
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		used, err = tx.ListPorts()
		return err
	})
	if err != nil {
		return nil, err
	}
	span := c.Config.PortMax - c.Config.PortMin + 1
	if span <= 0 {
		return nil, nil
	}
	start := rand.IntN(span)
	var out []int
	for i := 0; i < span && len(out) < portCandidates; i++ {
		p := c.Config.PortMin + (start+i)%span
		if _, taken := used[p]; !taken && c.Runtime.PortFree(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// claimEndpoint claims the first of ports (from withFreePorts) that no
// other request claimed meanwhile.
func (c *Cloud) claimEndpoint(tx dbcloud.Tx, owner string, ports []int) (*dbcloud.Endpoint, error) {
	if len(ports) == 0 {
		return nil, dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
			"No free port left in %d-%d for a new endpoint; delete a service or read replica set to free one.", c.Config.PortMin, c.Config.PortMax)
	}
	for _, p := range ports {
		if err := tx.ClaimPort(p, owner); dbcloud.IsConflict(err) {
			continue // another request's transaction took it first
		} else if err != nil {
			return nil, err
		}
		return &dbcloud.Endpoint{Host: c.Config.PublicHost, Port: p}, nil
	}
	return nil, errPortsTaken
}
