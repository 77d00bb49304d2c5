package e2e

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

type vpcEndpoint struct {
	Host  string `json:"host"`
	Port  int    `json:"port"`
	VPCID string `json:"vpc_id"`
}

type vpcService struct {
	service
	VPCEndpoint *vpcEndpoint `json:"vpcEndpoint"`
	Snake       *vpcEndpoint `json:"vpc_endpoint"`
}

type peering struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	ErrorMessage  string `json:"error_message"`
	ProvisionedID string `json:"provisioned_id"`
}

// TestVPC_AttachDetach: a service attached to a VPC accepts connections on
// its own loopback address (never an address of the VPC's CIDR), beside its
// public endpoint; after detaching, that address refuses connections.
func TestVPC_AttachDetach(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	ctx := context.Background()
	var vpc struct{ ID, CIDR string }
	if code := s.call("POST", "/projects/"+s.boot.ProjectID+"/vpcs", map[string]string{"name": "net", "cidr": "10.0.0.0/16", "region_code": "local"}, &vpc); code != 201 {
		t.Fatalf("create VPC: %d", code)
	}
	cidr := netip.MustParsePrefix(vpc.CIDR)
	var svcs []service
	for i := range 2 {
		created := s.create(map[string]any{"name": "vpc-" + strconv.Itoa(i), "cpu_millis": "shared"})
		s.waitStatus(created.ServiceID, "READY", time.Minute)
		svcs = append(svcs, created)
	}
	var eps []*vpcEndpoint
	for _, svc := range svcs {
		if code := s.call("POST", s.services()+"/"+svc.ServiceID+"/attachToVPC", map[string]string{"vpc_id": vpc.ID}, nil); code != 202 {
			t.Fatalf("attach: %d", code)
		}
		var got vpcService
		s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got)
		if got.Status != "CONFIGURING" && got.Status != "READY" {
			t.Errorf("status during attach: %s", got.Status)
		}
		s.waitStatus(svc.ServiceID, "READY", time.Minute)
		s.call("GET", s.services()+"/"+svc.ServiceID, nil, &got)
		ep := got.VPCEndpoint
		if ep == nil || got.Snake == nil || *ep != *got.Snake || ep.VPCID != vpc.ID {
			t.Fatalf("vpcEndpoint %+v, vpc_endpoint %+v", ep, got.Snake)
		}
		addr := netip.MustParseAddr(ep.Host)
		if !addr.IsLoopback() || cidr.Contains(addr) {
			t.Fatalf("VPC endpoint %s is not a loopback address outside %s", ep.Host, cidr)
		}
		eps = append(eps, ep)

		// Connect through the VPC endpoint, and still through the public one.
		viaVPC := svc
		viaVPC.Endpoint.Host, viaVPC.Endpoint.Port = ep.Host, ep.Port
		c := s.mustConnect(viaVPC, svc.InitialPassword)
		var addrSeen string
		c.QueryRow(ctx, `SELECT host(inet_server_addr())`).Scan(&addrSeen)
		if addrSeen != ep.Host {
			t.Errorf("connected to %s, want the VPC address %s", addrSeen, ep.Host)
		}
		s.mustConnect(svc, svc.InitialPassword)
	}
	if eps[0].Host == eps[1].Host {
		t.Errorf("two services in one VPC share the address %s", eps[0].Host)
	}
	// Delete of the VPC is refused while services are attached.
	if code := s.call("DELETE", "/projects/"+s.boot.ProjectID+"/vpcs/"+vpc.ID, nil, nil); code != 409 {
		t.Errorf("delete VPC with attached services: %d, want 409", code)
	}

	// Detach the first service: its VPC address refuses connections.
	if code := s.call("POST", s.services()+"/"+svcs[0].ServiceID+"/detachFromVPC", map[string]string{"vpc_id": vpc.ID}, nil); code != 202 {
		t.Fatalf("detach: %d", code)
	}
	s.waitStatus(svcs[0].ServiceID, "READY", time.Minute)
	var got vpcService
	s.call("GET", s.services()+"/"+svcs[0].ServiceID, nil, &got)
	if got.VPCEndpoint != nil {
		t.Errorf("vpcEndpoint after detach: %+v", got.VPCEndpoint)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(eps[0].Host, strconv.Itoa(eps[0].Port)), 2*time.Second)
	if err == nil {
		conn.Close()
		t.Error("the VPC address still accepts connections after detach")
	}
	s.mustConnect(svcs[0], svcs[0].InitialPassword) // the public endpoint is unaffected
}

// TestVPC_Peerings: a peering the provider accepts becomes active with a
// provisioned id; one it refuses fails with the reason; a delete goes
// through deleting; all of it survives a crash of dbcloud.
func TestVPC_Peerings(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	var vpc struct{ ID string }
	s.call("POST", "/projects/"+s.boot.ProjectID+"/vpcs", map[string]string{"name": "net", "cidr": "10.1.0.0/16", "region_code": "local"}, &vpc)
	peerings := "/projects/" + s.boot.ProjectID + "/vpcs/" + vpc.ID + "/peerings"
	var good, bad peering
	s.call("POST", peerings, map[string]string{"peer_account_id": "123456789012", "peer_region_code": "us-east-1", "peer_vpc_id": "vpc-0a1b2c3d4e5f67890"}, &good)
	s.call("POST", peerings, map[string]string{"peer_account_id": "123456789012", "peer_region_code": "us-east-1", "peer_vpc_id": "not-a-vpc"}, &bad)
	s.kill() // the operations are in the store; a restart finishes them
	s.start()
	wait := func(id, status string) peering {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var p peering
			code := s.call("GET", peerings+"/"+id, nil, &p)
			if status == "gone" && code == 404 || code == 200 && p.Status == status {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("peering %s: want %s, have %d %+v", id, status, code, p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if p := wait(good.ID, "active"); p.ProvisionedID == "" {
		t.Errorf("active peering without provisioned_id: %+v", p)
	}
	if p := wait(bad.ID, "failed"); p.ErrorMessage == "" || p.ProvisionedID != "" {
		t.Errorf("failed peering: %+v", p)
	}
	if code := s.call("DELETE", peerings+"/"+good.ID, nil, nil); code != 204 {
		t.Fatalf("delete peering: %d", code)
	}
	var during peering
	if code := s.call("GET", peerings+"/"+good.ID, nil, &during); code == 200 && during.Status != "deleting" {
		t.Errorf("status while deleting: %s", during.Status)
	}
	wait(good.ID, "gone")
	s.call("DELETE", peerings+"/"+bad.ID, nil, nil)
	wait(bad.ID, "gone")
	if code := s.call("DELETE", "/projects/"+s.boot.ProjectID+"/vpcs/"+vpc.ID, nil, nil); code != 204 {
		t.Errorf("delete VPC without peerings: %d", code)
	}
}
