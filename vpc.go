package dbcloud

import (
	"net/netip"
	"time"
)

// VPC is a virtual private cloud: a CIDR block in a region that services can
// be attached to. On the local runtime the CIDR is data, never routed.
type VPC struct {
	ID        string       `json:"id"`
	ProjectID string       `json:"project_id"`
	Name      string       `json:"name"`
	CIDR      netip.Prefix `json:"cidr"`
	Region    string       `json:"region"`
	Created   time.Time    `json:"created"`
}

// PeeringStatus is the provisioning status of a peering connection.
type PeeringStatus string

// Peering statuses (decisions.md section 9).
const (
	PeeringPending  PeeringStatus = "pending"
	PeeringActive   PeeringStatus = "active"
	PeeringFailed   PeeringStatus = "failed"
	PeeringDeleting PeeringStatus = "deleting"
)

// Peering connects a VPC with a VPC in an external cloud account.
type Peering struct {
	ID             string        `json:"id"`
	ProjectID      string        `json:"project_id"`
	VPCID          string        `json:"vpc_id"`
	PeerAccountID  string        `json:"peer_account_id"`
	PeerRegionCode string        `json:"peer_region_code"`
	PeerVPCID      string        `json:"peer_vpc_id"`
	Status         PeeringStatus `json:"status"`
	ErrorMessage   string        `json:"error_message,omitempty"`
	ProvisionedID  string        `json:"provisioned_id,omitempty"`
	Created        time.Time     `json:"created"`
}

var privateBlocks = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// ParseCIDR validates a VPC CIDR (decisions.md section 9): IPv4, host bits
// zero, prefix /16 to /28, inside one of the RFC 1918 blocks.
func ParseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() || p.Addr().Zone() != "" {
		return netip.Prefix{}, Errorf(KindInvalid, "cidr %q is not an IPv4 CIDR block in address/prefix notation, such as 10.0.0.0/16.", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, Errorf(KindInvalid, "cidr %q has host bits set; did you mean %s?", s, p.Masked())
	}
	if p.Bits() < 16 || p.Bits() > 28 {
		return netip.Prefix{}, Errorf(KindInvalid, "cidr %q has prefix /%d; the prefix must be /16 to /28.", s, p.Bits())
	}
	for _, b := range privateBlocks {
		if b.Contains(p.Addr()) && b.Bits() <= p.Bits() {
			return p, nil
		}
	}
	return netip.Prefix{}, Errorf(KindInvalid, "cidr %q is outside the private ranges; it must lie inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16.", s)
}
