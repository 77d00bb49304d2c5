package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"dbcloud"
	"dbcloud/runtime/local/postgres"
)

// DeleteService stops the service's instances and removes its files.
func (rt *Runtime) DeleteService(ctx context.Context, svc *dbcloud.Service) error {
	rt.unwatchPrimary(svc.ID)
	rt.sessions.close(ctx, svc.ID)
	// A delete can supersede a pending disable: the pooler goes first.
	if err := rt.stopPooler(ctx, svc.ID); err != nil {
		return err
	}
	// The endpoint proxy next, so no client reaches a stopping instance;
	// and the wake listeners of an auto-paused one.
	if err := rt.stopProxy(ctx, svc.ID); err != nil {
		return err
	}
	rt.releaseWake(svc.ID, -1).fail("it was deleted")
	dir := rt.serviceDir(svc.ID)
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		// A delete that crashed after removing the files still removes
		// the service's OS user (and what runs as it).
		if err := rt.removeLeftoverScratch(svc.ID); err != nil {
			return err
		}
		return rt.removeOwner(ctx, svc.ID)
	} else if err != nil {
		return err
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || !e.IsDir() {
			continue // not an instance directory
		}
		spec := postgres.Spec{ID: svc.ID + "-" + e.Name(), Dir: filepath.Join(dir, e.Name())}
		if err := rt.instances.Destroy(ctx, spec); err != nil {
			return fmt.Errorf("destroy %s: %w", spec.ID, err)
		}
	}
	rt.mu.Lock()
	delete(rt.cpu, svc.ID)
	delete(rt.xacts, svc.ID)
	delete(rt.downSince, svc.ID)
	delete(rt.storageNear, svc.ID)
	delete(rt.storage, svc.ID)
	delete(rt.quiet, svc.ID)
	rt.mu.Unlock()
	rt.credLogins.forget(svc.ID)
	rt.forgetExit(svc.ID)
	// A fork deleted before its restore finished releases its own hold on
	// its parent.
	if svc.Fork != nil {
		if err := rt.backups.Release(rt.serviceDir(svc.Fork.ServiceID), svc.ID); err != nil {
			return err
		}
	}
	// A restore check interrupted by a crash may have left its instance,
	// which runs as the service's user.
	if err := rt.removeLeftoverScratch(svc.ID); err != nil {
		return err
	}
	if err := rt.backups.RemoveService(rt.serviceDir(svc.ID)); err != nil {
		return err
	}
	return rt.removeOwner(ctx, svc.ID)
}
