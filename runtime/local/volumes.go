package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"dbcloud/runtime/local/internal/volume"
)

// StorageImageAuto is Config.StorageImageGiB's default in `dbcloud serve`:
// where the runtime directory's filesystem has no quotas (ext4, XFS, a
// btrfs without them), dbcloud keeps it on a btrfs image it makes, sized
// from the host's free disk less volume.HostReserve, so that every
// service's limit is a filesystem quota and a full image still leaves the
// host its reserve. Where none can be made (not root, no loop devices, no
// btrfs tools, too little free disk, services already on the host's
// filesystem) limits are measured instead, and the log says so.
const StorageImageAuto = -1

// openVolumes mounts the storage image if there is to be one and says
// what the runtime's filesystem offers: clones make forks and snapshots
// cheap, quotas make per-service limits real. It also returns the free
// space that admission keeps back on it: inside an image a slack for
// btrfs's own metadata (the host's reserve is outside the image), on the
// host's filesystem the host's reserve.
func openVolumes(cfg Config) (*volume.Volumes, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	file := cfg.DataDir + ".img"
	var im *volume.Image
	var why error
	switch {
	case cfg.StorageImageGiB > 0:
		i := volume.Image{File: file, Dir: cfg.DataDir, Size: int64(cfg.StorageImageGiB) << 30}
		if err := i.Mount(ctx); err != nil {
			return nil, 0, err
		}
		im = &i
	case cfg.StorageImageGiB == StorageImageAuto:
		i, err := autoImage(ctx, file, cfg.DataDir)
		if errors.Is(err, volume.ErrNoImage) {
			why = err
		} else if err != nil {
			return nil, 0, err
		} else {
			im = i
		}
	default:
		why = errors.New("--storage-image-gib is 0")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o711); err != nil {
		return nil, 0, err
	}
	fs, err := volume.Probe(ctx, cfg.DataDir)
	if err != nil {
		return nil, 0, err
	}
	log := cfg.Logger.With("dir", cfg.DataDir, "filesystem", fs.Type, "clones", fs.Reflink, "quotas", fs.Quotas, "summary", fs.String())
	if im != nil {
		log.Info("runtime storage: a btrfs image with a quota per service", "image", im.File,
			"image_mib", im.Size>>20, "image_reserve_mib", im.Reserve()>>20)
		return volume.New(fs), im.Reserve(), nil
	}
	_, total, err := volume.DiskSpace(cfg.DataDir)
	if err != nil {
		return nil, 0, err
	}
	reserve := volume.HostReserve(total)
	if fs.Quotas {
		log.Info("runtime storage", "host_reserve_mib", reserve>>20)
	} else {
		// Say plainly what a tenant can do here: the guard stops it at the
		// next measurement (every few seconds), and until then it writes
		// at disk speed.
		log.Warn("runtime storage: limits not enforced by the filesystem; each service is measured and made read-only at its limit, but may write past it by what it writes between two measurements",
			"reason", fmt.Sprint(why), "host_reserve_mib", reserve>>20)
	}
	return volume.New(fs), reserve, nil
}

// autoImage mounts the default image unless DataDir's filesystem has
// quotas of its own (an operator's btrfs), or none can be made
// (volume.ErrNoImage).
func autoImage(ctx context.Context, file, dir string) (*volume.Image, error) {
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o711); err != nil {
		return nil, err
	}
	host, err := volume.Probe(ctx, parent)
	if err != nil {
		return nil, err
	}
	if host.Quotas {
		return nil, nil
	}
	im, err := volume.MountAuto(ctx, file, dir)
	if err != nil {
		return nil, fmt.Errorf("runtime storage: %w", err)
	}
	return &im, nil
}

// RemoveStorageImage unmounts the storage image at dir, the runtime
// directory, and deletes its file (dir + ".img"), for `dbcloud admin
// teardown` once every service is gone; it reports whether there was
// one. An image made by default is dbcloud's: nothing else is on it.
func RemoveStorageImage(ctx context.Context, dir string) (bool, error) {
	return volume.Image{File: dir + ".img", Dir: dir}.Remove(ctx)
}
