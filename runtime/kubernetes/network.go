package kubernetes

import (
	"context"

	"dbcloud"
)

// CodeUnsupported is the wire code of a feature this runtime does not offer.
const CodeUnsupported = "UNSUPPORTED"

// Network is the VPC provider of this runtime: none. A Kubernetes cluster
// has no VPC peering of its own; an internal load balancer per attachment
// depends on the provider's annotations and was not built or verified here,
// so every VPC request is refused rather than faked.
type Network struct{}

var _ dbcloud.Network = Network{}

func unsupported() error {
	return dbcloud.CodedErrorf(dbcloud.KindConflict, CodeUnsupported,
		"VPCs are not supported by the %s runtime: its services are reached through Kubernetes Services in their project's namespace.", Name)
}

// CreateVPC refuses, so no VPC exists to attach to or peer with.
func (Network) CreateVPC(context.Context, *dbcloud.VPC) error { return unsupported() }

// DeleteVPC has nothing to remove.
func (Network) DeleteVPC(context.Context, *dbcloud.VPC) error { return nil }

// CreatePeering refuses.
func (Network) CreatePeering(context.Context, *dbcloud.VPC, *dbcloud.Peering) (string, error) {
	return "", dbcloud.Terminal(unsupported())
}

// DeletePeering has nothing to remove.
func (Network) DeletePeering(context.Context, *dbcloud.VPC, *dbcloud.Peering) error { return nil }

// Attach refuses.
func (Network) Attach(context.Context, *dbcloud.VPC, *dbcloud.Service) (*dbcloud.VPCEndpoint, error) {
	return nil, dbcloud.Terminal(unsupported())
}

// Detach has nothing to release.
func (Network) Detach(context.Context, *dbcloud.VPC, *dbcloud.Service) error { return nil }
