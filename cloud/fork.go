package cloud

import (
	"context"
	"slices"
	"time"

	"dbcloud"
)

// ServiceFork is a fork request. Empty strings mean "not given".
type ServiceFork struct {
	Strategy    string
	Name        *string
	CPUMillis   string
	MemoryGBs   string
	Environment string
	TargetTime  *time.Time
	// PGVersion, when given, must be the parent's: a fork restores the
	// parent's data files, which only its own major version reads.
	PGVersion *int
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
	if err := checkForkVersion(parent, in.PGVersion); err != nil {
		return nil, err
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
		var err error
		if name, err = dbcloud.NormalName("name", *in.Name); err != nil {
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
			PGVersion: parent.Spec.PGVersion,
		},
		PGVersionFull:    parent.PGVersionFull,
		Fork:             &dbcloud.ForkSource{ProjectID: projectID, ServiceID: parent.ID, Strategy: strategy, TargetTime: in.TargetTime},
		PasswordVerifier: dbcloud.NewSCRAMVerifier(password),
	}
	if err := c.insertService(ctx, svc, password, storageOf(parent), dbcloud.OpCreateService); err != nil {
		return nil, err
	}
	return &ServiceView{Service: svc, InitialPassword: password}, nil
}

// checkForkVersion refuses a fork asked for on another major version than
// its parent's (decisions.md section 11: fork, then upgrade the fork).
func checkForkVersion(parent *dbcloud.Service, want *int) error {
	if want == nil || *want == parent.Spec.PGVersion {
		return nil
	}
	return dbcloud.Errorf(dbcloud.KindInvalid,
		"pg_version %d: a fork runs its parent's PostgreSQL %d; fork it, then upgrade the fork.", *want, parent.Spec.PGVersion)
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
