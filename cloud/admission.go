package cloud

import (
	"context"
	"fmt"
	"strings"
	"time"

	"dbcloud/sizing"

	"dbcloud"
)

const (
	// instanceDiskMB is the free disk every new instance needs at least.
	instanceDiskMB = 1024
	// diskRetryAfter is when a change refused for want of disk is worth
	// retrying.
	diskRetryAfter = time.Minute
)

// hostLockID is the lock that serialises admissions to the host.
const hostLockID = "host-admission"

// Resources is what a set of instances reserves.
type Resources struct {
	Instances int
	// Shared counts the running shared instances among Instances.
	Shared    int
	CPUMillis int
	MemoryMB  int64
	StorageMB int64
}

func (r *Resources) add(o Resources) {
	r.Instances += o.Instances
	r.Shared += o.Shared
	r.CPUMillis += o.CPUMillis
	r.MemoryMB += o.MemoryMB
	r.StorageMB += o.StorageMB
}

// reservation is what one running instance of size reserves: a dedicated
// size its limits (package sizing), a shared one its footprint and no
// CPU, since shared instances share what is left (sizing's shared slice).
func reservation(size dbcloud.Size) (cpuMillis int, memoryMB int64) {
	if size.Shared {
		return 0, sizing.SharedFootprintBytes >> 20
	}
	r := sizing.For(size)
	return r.CPUMillis, r.MemoryBytes >> 20
}

func instances(n int, size dbcloud.Size, storageMB int64, running bool) Resources {
	r := Resources{StorageMB: int64(n) * storageMB}
	if running {
		cpu, mem := reservation(size)
		r.Instances, r.CPUMillis, r.MemoryMB = n, n*cpu, int64(n)*mem
		if size.Shared {
			r.Shared = n
		}
	}
	return r
}

func storageOf(s *dbcloud.Service) int64 {
	if s.Metrics == nil {
		return 0
	}
	return s.Metrics.StorageMB
}

// serviceDemand counts the primary and every HA standby. A stopped service
// keeps only its storage: starting it is admitted again. A service being
// deleted is counted as gone, so that its room can be reused at once.
func serviceDemand(s *dbcloud.Service) Resources {
	if s.Status == dbcloud.StatusDeleting {
		return Resources{}
	}
	return instances(1+s.Spec.Replicas, s.Spec.Size, storageOf(s), s.Spec.Running)
}

// replicaSetDemand counts every node, each holding a copy of the parent's data.
func replicaSetDemand(r *dbcloud.ReadReplicaSet, parent *dbcloud.Service) Resources {
	if r.Status == dbcloud.ReplicaSetDeleting || parent == nil || parent.Status == dbcloud.StatusDeleting {
		return Resources{}
	}
	return instances(r.Spec.Nodes, r.Spec.Size, storageOf(parent), parent.Spec.Running)
}

// candidate is the state an operation asks for, in place of the stored one
// (or beside it, for a new resource).
type candidate struct {
	services []*dbcloud.Service
	sets     []*dbcloud.ReadReplicaSet
	// size is the largest instance the change starts.
	size dbcloud.Size
	// storageMB is storage the change adds beyond what the candidates
	// have measured: a fork starts with a copy of its parent's data.
	storageMB int64
}

// hostCapacity asks the runtime what the host holds; nil when the runtime
// cannot tell. It does I/O, so it is called before a store transaction.
func (c *Cloud) hostCapacity() (*dbcloud.HostCapacity, error) {
	capacity := dbcloud.CapabilitiesOf(c.Runtime).Capacity
	if capacity == nil {
		return nil, nil
	}
	h, err := capacity.HostCapacity()
	if err != nil {
		return nil, fmt.Errorf("host capacity: %w", err)
	}
	return &h, nil
}

// admit refuses a change that would reserve more than the host or the
// project's quota allows. Only growth is refused: a change that keeps or
// lowers a total passes even when the total is over its limit, so that a
// user can always correct.
func (c *Cloud) admit(tx dbcloud.Tx, host *dbcloud.HostCapacity, projectID string, cand candidate) error {
	if host != nil {
		// The host is shared by every project: admissions of different
		// projects must not both take its last room. Always taken after
		// the project's lock, so the order cannot deadlock.
		if err := tx.LockProject(hostLockID); err != nil {
			return err
		}
	}
	projects, err := tx.ListProjects()
	if err != nil {
		return err
	}
	var hostBefore, hostAfter, projBefore, projAfter Resources
	var project *dbcloud.Project
	for _, p := range projects {
		before, after, err := c.projectDemand(tx, p.ID, cand)
		if err != nil {
			return err
		}
		if p.ID == projectID {
			after.StorageMB += cand.storageMB
		}
		hostBefore.add(before)
		hostAfter.add(after)
		if p.ID == projectID {
			project, projBefore, projAfter = p, before, after
		}
	}
	if host != nil {
		limits := sizing.For(cand.size)
		if cpu, mem := limits.CPUMillis, limits.MemoryBytes>>20; cpu > host.CPUMillis || mem<<20 > host.MemoryBytes {
			cpuLimit, memLimitMB := host.Limits()
			return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
				"This host has %d millicores and %s of memory, so an instance of size %s does not fit; %d millicores and %s are free to reserve now. Choose a smaller size.",
				host.CPUMillis, gib(host.MemoryBytes>>20), cand.size, max(0, cpuLimit-hostBefore.CPUMillis), gib(max(0, memLimitMB-hostBefore.MemoryMB)))
		}
		if err := hostCheck(host, hostBefore, hostAfter); err != nil {
			return err
		}
		if err := sharedCheck(host, hostBefore, hostAfter); err != nil {
			return err
		}
		if err := diskCheck(tx, host, cand.services); err != nil {
			return err
		}
	}
	q := c.Config.Quotas.Resources
	if project != nil && project.Quota != nil {
		q = *project.Quota
	}
	return quotaCheck(q, projBefore, projAfter)
}

// projectDemand sums what the project reserves now and with the candidate.
func (c *Cloud) projectDemand(tx dbcloud.Tx, projectID string, cand candidate) (before, after Resources, err error) {
	svcs, err := tx.ListServices(projectID)
	if err != nil {
		return before, after, err
	}
	sets, err := tx.ListReplicaSets(projectID, "")
	if err != nil {
		return before, after, err
	}
	stored := make(map[string]*dbcloud.Service, len(svcs))
	changed := make(map[string]*dbcloud.Service)
	for _, s := range cand.services {
		if s.ProjectID == projectID {
			changed[s.ID] = s
		}
	}
	for _, s := range svcs {
		stored[s.ID] = s
		before.add(serviceDemand(s))
		if n, ok := changed[s.ID]; ok {
			after.add(serviceDemand(n))
			delete(changed, s.ID)
		} else {
			after.add(serviceDemand(s))
		}
	}
	for _, s := range changed { // new services
		after.add(serviceDemand(s))
		stored[s.ID] = s
	}
	changedSets := make(map[string]*dbcloud.ReadReplicaSet)
	for _, r := range cand.sets {
		if r.ProjectID == projectID {
			changedSets[r.ID] = r
		}
	}
	for _, r := range sets {
		before.add(replicaSetDemand(r, stored[r.ServiceID]))
		if n, ok := changedSets[r.ID]; ok {
			after.add(replicaSetDemand(n, stored[r.ServiceID]))
			delete(changedSets, r.ID)
		} else {
			after.add(replicaSetDemand(r, stored[r.ServiceID]))
		}
	}
	for _, r := range changedSets { // new sets
		after.add(replicaSetDemand(r, stored[r.ServiceID]))
	}
	return before, after, nil
}

func hostCheck(h *dbcloud.HostCapacity, before, after Resources) error {
	cpuLimit, memLimitMB := h.Limits()
	var over []string
	if after.CPUMillis > before.CPUMillis && after.CPUMillis > cpuLimit {
		over = append(over, fmt.Sprintf("it needs %d more millicores and %d are free (of %d)",
			after.CPUMillis-before.CPUMillis, max(0, cpuLimit-before.CPUMillis), cpuLimit))
	}
	if after.MemoryMB > before.MemoryMB && after.MemoryMB > memLimitMB {
		over = append(over, fmt.Sprintf("it needs %s more memory (a quarter of it shared_buffers) and %s is free (of %s)",
			gib(after.MemoryMB-before.MemoryMB), gib(max(0, memLimitMB-before.MemoryMB)), gib(memLimitMB)))
	}
	added := after.Instances - before.Instances
	diskShort := added > 0 && h.DiskFreeBytes>>20 < int64(added)*instanceDiskMB
	if diskShort {
		over = append(over, fmt.Sprintf("it needs %s of free disk for %d new instances and %s is free",
			gib(int64(added)*instanceDiskMB), added, gib(h.DiskFreeBytes>>20)))
	}
	switch {
	case len(over) == 0:
		return nil
	case diskShort && len(over) == 1:
		// Space comes back as data and snapshots are deleted or the
		// operator frees it: a retry may succeed with no other change.
		return &dbcloud.Error{Kind: dbcloud.KindUnavailable, RetryAfter: diskRetryAfter, Message: fmt.Sprintf(
			"This host's disk is too full for the change: %s. Retry once space is freed (delete data or services), or ask the operator.", over[0])}
	}
	return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
		"This host cannot hold the change: %s. Choose a smaller size or fewer instances, or stop or delete a service.", strings.Join(over, "; "))
}

// sharedCheck admits shared instances against the memory the host has
// left for them: its memory less what the running dedicated instances
// reserve and the system reserve, at a footprint each (sizing's shared
// slice). A host whose memory is in use now (MemAvailable under the
// reserve and one footprint) takes no new one either. Only growth of the
// shared count is refused.
func sharedCheck(h *dbcloud.HostCapacity, before, after Resources) error {
	if after.Shared <= before.Shared {
		return nil
	}
	footMB := int64(sizing.SharedFootprintBytes >> 20)
	memMB, reserveMB := h.MemoryBytes>>20, sizing.SystemReserveBytes(h.MemoryBytes)>>20
	dedicatedMB := min(max(0, after.MemoryMB-int64(after.Shared)*footMB), memMB)
	most := max(0, (memMB-dedicatedMB-reserveMB)/footMB)
	if int64(after.Shared) > most {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
			"This host runs %d shared services and holds at most %d: each counts %d MiB against its %s of memory, less %s reserved by running dedicated services and %s kept for dbcloud and the system. Stop or delete a shared service, or choose a dedicated size.",
			before.Shared, most, footMB, gib(memMB), gib(dedicatedMB), gib(reserveMB))
	}
	if h.MemAvailableBytes > 0 && h.MemAvailableBytes < sizing.SystemReserveBytes(h.MemoryBytes)+sizing.SharedFootprintBytes {
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
			"This host's memory is in use: %s is available, and a shared service needs %d MiB beyond the %s kept for dbcloud and the system. Stop or delete a service, or retry when the host has memory free.",
			gib(h.MemAvailableBytes>>20), footMB, gib(reserveMB))
	}
	return nil
}

// diskCheck refuses a change that raises a service's storage limit (a
// create, a fork, a resize to a larger size) beyond what the disk can
// still give it: the limit, less what the service keeps already, must fit
// in the free space less the reserve. (The filesystem stops a service a
// little above its limit, the local runtime's hardLimit; the reserve
// covers that headroom.) Storage is thinly provisioned: the limits of all
// services together may exceed the disk, as most services never reach
// theirs; what bounds them is each one's quota and the image's size, and
// this check only keeps the disk from promising one service more than it
// has left. A change that keeps or lowers a limit always passes.
func diskCheck(tx dbcloud.Tx, h *dbcloud.HostCapacity, services []*dbcloud.Service) error {
	if h.StorageLimit == nil {
		return nil
	}
	room := max(0, h.DiskFreeBytes-h.DiskReserveBytes)
	for _, s := range services {
		want := h.StorageLimit(s.Spec.Size)
		old, err := tx.FindService(s.ProjectID, s.ID)
		if err != nil && !dbcloud.IsNotFound(err) {
			return err
		}
		if old != nil && old.Status != dbcloud.StatusDeleting && want <= h.StorageLimit(old.Spec.Size) {
			continue
		}
		need := want - storageOf(s)<<20
		if need <= room {
			continue
		}
		return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeCapacityExceeded,
			"This host's disk cannot hold a service of size %s: it may keep up to %s on disk and %s is free to give (%s free, less %s kept in reserve). Choose a smaller size, or delete data or services, or ask the operator for more disk.",
			s.Spec.Size, gib(want>>20), gib(room>>20), gib(h.DiskFreeBytes>>20), gib(h.DiskReserveBytes>>20))
	}
	return nil
}

func quotaCheck(q dbcloud.ResourceQuota, before, after Resources) error {
	var over []string
	check := func(name string, limit, b, a int64, unit func(int64) string) {
		if limit > 0 && a > b && a > limit {
			over = append(over, fmt.Sprintf("%s: it needs %s more and %s is free (quota %s)", name, unit(a-b), unit(max(0, limit-b)), unit(limit)))
		}
	}
	num := func(v int64) string { return fmt.Sprint(v) }
	check("instances", int64(q.Instances), int64(before.Instances), int64(after.Instances), num)
	check("millicores", int64(q.CPUMillis), int64(before.CPUMillis), int64(after.CPUMillis), num)
	check("memory", int64(q.MemoryGBs)*1024, before.MemoryMB, after.MemoryMB, gib)
	check("storage", int64(q.StorageGBs)*1024, before.StorageMB, after.StorageMB, gib)
	if len(over) == 0 {
		return nil
	}
	return dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeQuotaExceeded,
		"The project's resource quota does not allow the change; %s. Choose a smaller size or fewer instances, stop or delete a service, or ask the operator for a larger quota.", strings.Join(over, "; "))
}

// gib formats megabytes as GiB, with one decimal when needed.
func gib(mb int64) string {
	if mb%1024 == 0 {
		return fmt.Sprintf("%d GiB", mb/1024)
	}
	return fmt.Sprintf("%.1f GiB", float64(mb)/1024)
}

// SetProjectQuota gives a project its own resource quota; nil returns it
// to the server's default. It is an admin operation: lowering a quota
// refuses growth from then on and removes nothing.
func (c *Cloud) SetProjectQuota(ctx context.Context, projectID string, q *dbcloud.ResourceQuota) (*dbcloud.Project, error) {
	if q != nil && (q.Instances < 0 || q.CPUMillis < 0 || q.MemoryGBs < 0 || q.StorageGBs < 0) {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "Quota values must be 0 (no limit) or more.")
	}
	var p *dbcloud.Project
	err := c.Store.Update(ctx, func(tx dbcloud.Tx) (err error) {
		if err := tx.LockProject(projectID); err != nil {
			return err
		}
		if p, err = tx.FindProject(projectID); err != nil {
			if dbcloud.IsNotFound(err) {
				return dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", projectID)
			}
			return err
		}
		p.Quota = q
		return tx.UpdateProject(p)
	})
	return p, err
}

// admitService admits the service as change would leave it.
func (c *Cloud) admitService(tx dbcloud.Tx, host *dbcloud.HostCapacity, s *dbcloud.Service, change func(*dbcloud.Service)) error {
	n := *s
	change(&n)
	return c.admit(tx, host, s.ProjectID, candidate{services: []*dbcloud.Service{&n}, size: n.Spec.Size})
}
