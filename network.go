package dbcloud

import "context"

// Network is the provider of VPCs: it makes VPCs, peerings with other
// clouds' VPCs, and the attachment of services to VPCs real. The engine
// calls it; every method is idempotent. A cloud implementation maps these
// onto its own VPCs, peering connections and private endpoints; the local
// one (network/loopback) gives each attached service a loopback address.
//
// A refusal the client must see (a peer VPC ID the provider does not
// accept, say) is returned as Terminal(Errorf(KindInvalid, message)): the
// engine then fails the peering with that message instead of retrying.
type Network interface {
	// CreateVPC makes the VPC exist in the provider.
	CreateVPC(ctx context.Context, vpc *VPC) error
	// DeleteVPC removes it; the domain allows it only with no service
	// attached and no peering left.
	DeleteVPC(ctx context.Context, vpc *VPC) error
	// CreatePeering connects vpc with the peer VPC and returns the
	// provider's identifier of the connection.
	CreatePeering(ctx context.Context, vpc *VPC, p *Peering) (provisionedID string, err error)
	// DeletePeering removes the connection.
	DeletePeering(ctx context.Context, vpc *VPC, p *Peering) error
	// Attach returns the address inside vpc at which svc is to accept
	// connections; the runtime then serves the service there.
	Attach(ctx context.Context, vpc *VPC, svc *Service) (*VPCEndpoint, error)
	// Detach releases what Attach reserved.
	Detach(ctx context.Context, vpc *VPC, svc *Service) error
}
