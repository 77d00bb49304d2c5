// Package loopback is the network provider of the single-host runtime. A
// VPC's CIDR is data there: it is validated and stored but never routed, and
// no packet is ever sent to an address of it. A service attached to a VPC
// gets an address of its own from a block inside 127.0.0.0/8, on which its
// PostgreSQL accepts connections beside its public endpoint.
package loopback

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"

	"dbcloud"
)

// Network is the loopback provider.
type Network struct {
	// Block is where VPC endpoint addresses come from; it must lie inside
	// 127.0.0.0/8.
	Block netip.Prefix
	// PortMin is the lowest endpoint port. A service's address is derived
	// from its endpoint port, which is unique on the host, so addresses
	// need no bookkeeping and are the same after any restart.
	PortMin, PortMax int
}

var _ dbcloud.Network = (*Network)(nil)

// New returns a provider handing out addresses from block to services whose
// endpoint ports lie in [portMin, portMax].
func New(block netip.Prefix, portMin, portMax int) (*Network, error) {
	loop := netip.MustParsePrefix("127.0.0.0/8")
	if !block.Addr().Is4() || !loop.Contains(block.Addr()) || block.Bits() < 8 || block.Masked() != block {
		return nil, fmt.Errorf("VPC address block %s must be a network inside 127.0.0.0/8", block)
	}
	// Leave out the block's first address; every port needs one of the rest.
	if size := 1 << (32 - block.Bits()); size-1 < portMax-portMin+1 {
		return nil, fmt.Errorf("VPC address block %s has %d addresses; endpoints need %d", block, size-1, portMax-portMin+1)
	}
	return &Network{Block: block, PortMin: portMin, PortMax: portMax}, nil
}

// CreateVPC has nothing to make on one host.
func (n *Network) CreateVPC(ctx context.Context, vpc *dbcloud.VPC) error { return nil }

// DeleteVPC has nothing to remove on one host.
func (n *Network) DeleteVPC(ctx context.Context, vpc *dbcloud.VPC) error { return nil }

// The forms of the peer's identifiers this provider accepts: those of AWS,
// whose VPCs are the usual peers of a database cloud.
var (
	accountID = regexp.MustCompile(`^[0-9]{12}$`)
	regionID  = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]$`)
	vpcID     = regexp.MustCompile(`^vpc-([0-9a-f]{8}|[0-9a-f]{17})$`)
)

// CreatePeering accepts a peer whose identifiers have the right form and
// returns a stable connection identifier. On one host there is no other
// cloud to reach, so the connection carries no traffic.
func (n *Network) CreatePeering(ctx context.Context, vpc *dbcloud.VPC, p *dbcloud.Peering) (string, error) {
	refuse := func(format string, args ...any) (string, error) {
		return "", dbcloud.Terminal(dbcloud.Errorf(dbcloud.KindInvalid, format, args...))
	}
	switch {
	case !accountID.MatchString(p.PeerAccountID):
		return refuse("peer_account_id %q is not an account ID (12 digits).", p.PeerAccountID)
	case !regionID.MatchString(p.PeerRegionCode):
		return refuse("peer_region_code %q is not a region code such as us-east-1.", p.PeerRegionCode)
	case !vpcID.MatchString(p.PeerVPCID):
		return refuse("peer_vpc_id %q is not a VPC ID such as vpc-0a1b2c3d4e5f67890.", p.PeerVPCID)
	}
	sum := sha256.Sum256([]byte(vpc.ID + "/" + p.ID))
	return "pcx-" + hex.EncodeToString(sum[:])[:17], nil
}

// DeletePeering has nothing to remove on one host.
func (n *Network) DeletePeering(ctx context.Context, vpc *dbcloud.VPC, p *dbcloud.Peering) error {
	return nil
}

// Attach gives the service its address in the block: the port's offset in
// the port range picks it, so two services never share one.
func (n *Network) Attach(ctx context.Context, vpc *dbcloud.VPC, svc *dbcloud.Service) (*dbcloud.VPCEndpoint, error) {
	if svc.Endpoint == nil || svc.Endpoint.Port < n.PortMin || svc.Endpoint.Port > n.PortMax {
		return nil, dbcloud.Terminal(fmt.Errorf("service %s has no endpoint port in %d-%d", svc.ID, n.PortMin, n.PortMax))
	}
	addr := n.Block.Addr()
	for range svc.Endpoint.Port - n.PortMin + 1 {
		addr = addr.Next()
	}
	return &dbcloud.VPCEndpoint{
		Endpoint: dbcloud.Endpoint{Host: addr.String(), Port: svc.Endpoint.Port}, VPCID: vpc.ID,
	}, nil
}

// Detach has nothing to release: the address is the service's own.
func (n *Network) Detach(ctx context.Context, vpc *dbcloud.VPC, svc *dbcloud.Service) error {
	return nil
}
