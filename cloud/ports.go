package cloud

import (
	"context"
	"errors"
	"math/rand/v2"

	"dbcloud"
)

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
