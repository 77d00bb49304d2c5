package loopback

import (
	"context"
	"net/netip"
	"testing"

	"dbcloud"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		block   string
		min, mx int
		ok      bool
	}{
		{"127.77.0.0/16", 15432, 25431, true},
		{"127.77.0.0/24", 15432, 25431, false}, // too small
		{"10.0.0.0/16", 15432, 15532, false},   // not loopback: never route to a VPC range
		{"127.77.0.1/16", 15432, 15532, false}, // host bits
	} {
		_, err := New(netip.MustParsePrefix(tc.block), tc.min, tc.mx)
		if (err == nil) != tc.ok {
			t.Errorf("New(%s, %d, %d) = %v, want ok=%v", tc.block, tc.min, tc.mx, err, tc.ok)
		}
	}
}

func TestAttach(t *testing.T) {
	n, err := New(netip.MustParsePrefix("127.77.0.0/16"), 15432, 25431)
	if err != nil {
		t.Fatal(err)
	}
	vpc := &dbcloud.VPC{ID: "123", CIDR: netip.MustParsePrefix("10.0.0.0/16")}
	seen := map[string]bool{}
	for _, port := range []int{15432, 15433, 20000, 25431} {
		svc := &dbcloud.Service{ID: "s", Endpoint: &dbcloud.Endpoint{Host: "127.0.0.1", Port: port}}
		ep, err := n.Attach(context.Background(), vpc, svc)
		if err != nil {
			t.Fatal(err)
		}
		a := netip.MustParseAddr(ep.Host)
		if !n.Block.Contains(a) || vpc.CIDR.Contains(a) || ep.Port != port || ep.VPCID != "123" {
			t.Errorf("port %d: endpoint %+v", port, ep)
		}
		if seen[ep.Host] {
			t.Errorf("address %s given twice", ep.Host)
		}
		seen[ep.Host] = true
	}
}

func TestCreatePeering(t *testing.T) {
	n, _ := New(netip.MustParsePrefix("127.77.0.0/16"), 15432, 25431)
	vpc := &dbcloud.VPC{ID: "123"}
	good := &dbcloud.Peering{ID: "9", PeerAccountID: "123456789012", PeerRegionCode: "us-east-1", PeerVPCID: "vpc-0a1b2c3d4e5f67890"}
	id, err := n.CreatePeering(context.Background(), vpc, good)
	if err != nil || len(id) != 21 {
		t.Fatalf("CreatePeering = %q, %v", id, err)
	}
	if again, _ := n.CreatePeering(context.Background(), vpc, good); again != id {
		t.Errorf("provisioned id not stable: %s, %s", id, again)
	}
	for _, bad := range []dbcloud.Peering{
		{PeerAccountID: "12", PeerRegionCode: "us-east-1", PeerVPCID: "vpc-0a1b2c3d"},
		{PeerAccountID: "123456789012", PeerRegionCode: "mars", PeerVPCID: "vpc-0a1b2c3d"},
		{PeerAccountID: "123456789012", PeerRegionCode: "us-east-1", PeerVPCID: "subnet-0a1b2c3d"},
	} {
		_, err := n.CreatePeering(context.Background(), vpc, &bad)
		if !dbcloud.IsTerminal(err) || dbcloud.ErrorKindOf(err) != dbcloud.KindInvalid {
			t.Errorf("CreatePeering(%+v) = %v, want a terminal refusal", bad, err)
		}
	}
}
