package cloud

import (
	"context"
	"fmt"
	"math"

	"dbcloud"
)

// ReplicaSetCreate is a create-read-replica-set request.
type ReplicaSetCreate struct {
	Name      string
	CPUMillis float64
	MemoryGBs float64
	Nodes     int
}

// ReplicaSetResize is a resize-read-replica-set request; Nodes 0 keeps the count.
type ReplicaSetResize struct {
	CPUMillis string
	MemoryGBs string
	Nodes     *int
}

// ListReplicaSets lists a service's read replica sets.
func (c *Cloud) ListReplicaSets(ctx context.Context, projectID, serviceID string) ([]*dbcloud.ReadReplicaSet, error) {
	var out []*dbcloud.ReadReplicaSet
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) error {
		if _, err := findService(tx, projectID, serviceID); err != nil {
			return err
		}
		var err error
		out, err = tx.ListReplicaSets(projectID, serviceID)
		return err
	})
	return out, err
}

func findReplicaSet(tx dbcloud.Tx, projectID, serviceID, id string) (*dbcloud.ReadReplicaSet, error) {
	if _, err := findService(tx, projectID, serviceID); err != nil {
		return nil, err
	}
	r, err := tx.FindReplicaSet(projectID, id)
	if dbcloud.IsNotFound(err) || (err == nil && r.ServiceID != serviceID) {
		return nil, dbcloud.Errorf(dbcloud.KindNotFound, "Read replica set %q not found.", id)
	}
	return r, err
}

func wholeNumber(field string, f float64) (int, error) {
	if f != math.Trunc(f) || f < 0 || f > math.MaxInt32 {
		return 0, dbcloud.Errorf(dbcloud.KindInvalid, "%s must be a whole number, got %v.", field, f)
	}
	return int(f), nil
}

func (c *Cloud) checkNodes(nodes int) error {
	if nodes < 1 {
		return dbcloud.Errorf(dbcloud.KindInvalid, "nodes must be 1 or more, got %d.", nodes)
	}
	if nodes > c.Config.Quotas.MaxReplicaSetNodes {
		return quotaError("nodes %d is over the limit of %d nodes per read replica set.", nodes, c.Config.Quotas.MaxReplicaSetNodes)
	}
	return nil
}

// CreateReplicaSet records a read replica set of a service.
func (c *Cloud) CreateReplicaSet(ctx context.Context, projectID, serviceID string, in ReplicaSetCreate) (*dbcloud.ReadReplicaSet, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return nil, err
	}
	var err error
	if in.Name, err = dbcloud.NormalName("name", in.Name); err != nil {
		return nil, err
	}
	cpu, err := wholeNumber("cpu_millis", in.CPUMillis)
	if err != nil {
		return nil, err
	}
	mem, err := wholeNumber("memory_gbs", in.MemoryGBs)
	if err != nil {
		return nil, err
	}
	size, err := c.Config.Sizes.ResolveNumbers(cpu, mem)
	if err != nil {
		return nil, err
	}
	if err := c.checkNodes(in.Nodes); err != nil {
		return nil, err
	}
	r := &dbcloud.ReadReplicaSet{
		ID: dbcloud.NewID(), ProjectID: projectID, ServiceID: serviceID, Name: in.Name,
		Spec: dbcloud.ReadReplicaSetSpec{Size: size, Nodes: in.Nodes}, Generation: 1, Status: dbcloud.ReplicaSetCreating,
	}
	host, err := c.hostCapacity()
	if err != nil {
		return nil, err
	}
	err = c.withFreePorts(ctx, func(ports []int) error {
		return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
			return c.insertReplicaSet(ctx, tx, host, r, ports)
		})
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// insertReplicaSet records a new read replica set of any environment
// (decisions.md section 5) with its endpoint and first operation.
func (c *Cloud) insertReplicaSet(ctx context.Context, tx dbcloud.Tx, host *dbcloud.HostCapacity, r *dbcloud.ReadReplicaSet, ports []int) error {
	projectID, serviceID := r.ProjectID, r.ServiceID
	s, err := findService(tx, projectID, serviceID)
	if err != nil {
		return err
	}
	if s.Status != dbcloud.StatusReady {
		return dbcloud.Errorf(dbcloud.KindConflict, "Service %s is %s; read replica sets can be created when it is READY.", s.ID, s.Status)
	}
	if err := noAutoPause(s, "a read replica set"); err != nil {
		return err
	}
	sets, err := tx.ListReplicaSets(projectID, serviceID)
	if err != nil {
		return err
	}
	if len(sets) >= c.Config.Quotas.ReplicaSetsPerService {
		return quotaError("Service %s already has %d read replica sets; the limit is %d.", s.ID, len(sets), c.Config.Quotas.ReplicaSetsPerService)
	}
	r.Spec.Environment = s.Spec.Environment
	r.Created = c.now()
	if err := c.admit(tx, host, projectID, candidate{sets: []*dbcloud.ReadReplicaSet{r}, size: r.Spec.Size}); err != nil {
		return err
	}
	if r.Endpoint, err = c.claimEndpoint(tx, r.ID, ports); err != nil {
		return err
	}
	if err := tx.InsertReplicaSet(r); err != nil {
		return err
	}
	claim(ctx, "replica_set", r.ID)
	return c.insertChildOperation(ctx, tx, projectID, r.ServiceID, r.ID, dbcloud.OpCreateReplicaSet, r.Generation)
}

// mutateReplicaSet is the frame of every change to a read replica set; see
// mutateService.
func (c *Cloud) mutateReplicaSet(ctx context.Context, projectID, serviceID, id string, fn func(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) (dbcloud.OperationType, error)) error {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return err
	}
	return c.update(ctx, projectID, func(tx dbcloud.Tx) error {
		r, err := findReplicaSet(tx, projectID, serviceID, id)
		if err != nil {
			return err
		}
		before := *r
		op, err := fn(tx, r)
		if err != nil {
			return err
		}
		if op != "" {
			r.Generation++
			if err := c.insertChildOperation(ctx, tx, projectID, r.ServiceID, r.ID, op, r.Generation); err != nil {
				return err
			}
		}
		if op == "" && before.Spec == r.Spec && before.Status == r.Status {
			return nil
		}
		return tx.UpdateReplicaSet(r)
	})
}

func replicaSetBusy(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) error {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: r.ID, Pending: true, Limit: 1})
	if err != nil {
		return err
	}
	if len(pending) > 0 || (r.Status != dbcloud.ReplicaSetActive && r.Status != dbcloud.ReplicaSetError) {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeOperationInProgress,
			"Read replica set %s is %s with an operation in progress; retry when it is done.", r.ID, r.Status)
	}
	return nil
}

// correctReplicaSet is replicaSetBusy for a resize: pending work that keeps
// failing is superseded instead of refusing the correction.
func (c *Cloud) correctReplicaSet(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) error {
	pending, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: r.ID, Pending: true})
	if err != nil {
		return err
	}
	failing := false
	for _, op := range pending {
		failing = failing || op.Attempts > 0
	}
	if !failing || r.Status == dbcloud.ReplicaSetDeleting {
		return replicaSetBusy(tx, r)
	}
	return c.supersede(tx, pending, "superseded by a newer request")
}

// DeleteReplicaSet marks a read replica set for deletion.
func (c *Cloud) DeleteReplicaSet(ctx context.Context, projectID, serviceID, id string) error {
	return c.mutateReplicaSet(ctx, projectID, serviceID, id, func(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) (dbcloud.OperationType, error) {
		if r.Status == dbcloud.ReplicaSetDeleting {
			return "", nil
		}
		if err := c.supersedePending(tx, r.ID); err != nil {
			return "", err
		}
		r.Status = dbcloud.ReplicaSetDeleting
		return dbcloud.OpDeleteReplicaSet, nil
	})
}

// ResizeReplicaSet changes the size and optionally the node count of a set.
func (c *Cloud) ResizeReplicaSet(ctx context.Context, projectID, serviceID, id string, in ReplicaSetResize) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	if in.CPUMillis == "" || in.MemoryGBs == "" {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "cpu_millis and memory_gbs are both required.")
	}
	size, err := c.Config.Sizes.Resolve(in.CPUMillis, in.MemoryGBs, dbcloud.Size{})
	if err != nil {
		return "", err
	}
	if size.Shared {
		return "", dbcloud.Errorf(dbcloud.KindInvalid, "Read replica sets cannot use shared resources; allowed pairs: %s.", dbcloud.SizeTable(c.Config.Sizes.Dedicated()).Allowed())
	}
	if in.Nodes != nil {
		if err := c.checkNodes(*in.Nodes); err != nil {
			return "", err
		}
	}
	host, err := c.hostCapacity()
	if err != nil {
		return "", err
	}
	err = c.mutateReplicaSet(ctx, projectID, serviceID, id, func(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) (dbcloud.OperationType, error) {
		nodes := r.Spec.Nodes
		if in.Nodes != nil {
			nodes = *in.Nodes
		}
		if r.Spec.Size == size && r.Spec.Nodes == nodes && r.Status != dbcloud.ReplicaSetDeleting && replicaSetBusy(tx, r) == nil {
			return "", nil
		}
		if err := c.correctReplicaSet(tx, r); err != nil {
			return "", err
		}
		n := *r
		n.Spec.Size, n.Spec.Nodes = size, nodes
		if err := c.admit(tx, host, projectID, candidate{sets: []*dbcloud.ReadReplicaSet{&n}, size: size}); err != nil {
			return "", err
		}
		r.Spec.Size, r.Spec.Nodes = size, nodes
		r.Status = dbcloud.ReplicaSetResizing
		return dbcloud.OpResizeReplicaSet, nil
	})
	return fmt.Sprintf("Read replica set %s is being resized.", id), err
}

// SetReplicaSetPooler enables or disables a set's connection pooler.
func (c *Cloud) SetReplicaSetPooler(ctx context.Context, projectID, serviceID, id string, enabled bool) (string, error) {
	err := c.withFreePorts(ctx, func(ports []int) error {
		return c.mutateReplicaSet(ctx, projectID, serviceID, id, func(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) (dbcloud.OperationType, error) {
			if r.Spec.Pooler == enabled && r.Status != dbcloud.ReplicaSetDeleting {
				return "", nil
			}
			if enabled {
				if err := replicaSetBusy(tx, r); err != nil {
					return "", err
				}
			} else if err := c.correctReplicaSet(tx, r); err != nil {
				return "", err
			}
			if enabled && r.PoolerPort == 0 {
				// Claimed once and released with the set's endpoint port.
				ep, err := c.claimEndpoint(tx, r.ID, ports)
				if err != nil {
					return "", err
				}
				r.PoolerPort = ep.Port
			}
			r.Spec.Pooler = enabled
			// Shown as in progress (there is no other busy state for a
			// set) until the pooler is as asked, so a 409 for another
			// change meanwhile is explained by what GET shows.
			r.Status = dbcloud.ReplicaSetResizing
			return dbcloud.OpSetReplicaPooler, nil
		})
	})
	if enabled {
		return "Connection pooler enabled; its endpoint appears once it accepts connections.", err
	}
	return "Connection pooler disabled.", err
}

// SetReplicaSetEnvironment changes a set's environment tag.
func (c *Cloud) SetReplicaSetEnvironment(ctx context.Context, projectID, serviceID, id, env string) (string, error) {
	if err := c.authorizeWrite(ctx, projectID); err != nil {
		return "", err
	}
	e, err := dbcloud.ParseEnvironment("environment", env)
	if err != nil {
		return "", err
	}
	err = c.mutateReplicaSet(ctx, projectID, serviceID, id, func(tx dbcloud.Tx, r *dbcloud.ReadReplicaSet) (dbcloud.OperationType, error) {
		if r.Spec.Environment == e {
			return "", nil
		}
		if err := replicaSetBusy(tx, r); err != nil {
			return "", err
		}
		r.Spec.Environment = e
		return "", nil
	})
	return fmt.Sprintf("Environment set to %s.", e), err
}

// GetReplicaSet returns one read replica set of a service.
func (c *Cloud) GetReplicaSet(ctx context.Context, projectID, serviceID, id string) (*dbcloud.ReadReplicaSet, error) {
	var r *dbcloud.ReadReplicaSet
	err := c.view(ctx, projectID, func(tx dbcloud.Tx) (err error) {
		r, err = findReplicaSet(tx, projectID, serviceID, id)
		return err
	})
	return r, err
}
