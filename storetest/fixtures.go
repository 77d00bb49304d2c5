package storetest

import (
	"net/netip"
	"time"

	"dbcloud"
	"dbcloud/identity"
)

// t0 has nanoseconds on purpose: stores must keep full precision, even
// though the domain truncates to microseconds.
var t0 = time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.UTC)

// at returns t0 plus n seconds, to order fixtures in time.
func at(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

func ptr[T any](v T) *T { return &v }

// Fixtures fill every field, optional ones included, so that a round trip
// that drops or mangles any field fails.

func newUser(id string, created time.Time) *dbcloud.User {
	return &dbcloud.User{ID: id, Name: "User " + id, Email: id + "@example.com", Created: created,
		Disabled: ptr(created.Add(time.Hour)), PasswordHash: "$argon2id$v=19$m=1024,t=1,p=1$c2FsdA$aGFzaA-" + id}
}

func newProject(id string, created time.Time) *dbcloud.Project {
	return &dbcloud.Project{ID: id, Name: "Project " + id, PlanType: "FREE", Created: created}
}

func newAPIKey(projectID, accessKey string, created time.Time) *dbcloud.APIKey {
	return &dbcloud.APIKey{
		AccessKey:  accessKey,
		ProjectID:  projectID,
		UserID:     "user1",
		Name:       "key " + accessKey,
		Role:       identity.Developer,
		SecretHash: dbcloud.HashSecret("secret-" + accessKey),
		Created:    created,
		Revoked:    ptr(created.Add(time.Hour)),
	}
}

// NewService returns a service with every field set; benchmarks of other
// packages may use it to get realistically sized documents.
func NewService(projectID, id string, created time.Time) *dbcloud.Service {
	return &dbcloud.Service{
		ID:        id,
		ProjectID: projectID,
		Name:      "service " + id,
		Region:    "local",
		Type:      dbcloud.ServiceTypeTimeseriesDB,
		Created:   created,
		Spec: dbcloud.ServiceSpec{
			Size:         dbcloud.Size{CPUMillis: 2000, MemoryGBs: 8},
			Addons:       []dbcloud.Addon{dbcloud.AddonTimeSeries, dbcloud.AddonAI},
			Environment:  dbcloud.EnvProd,
			Replicas:     2,
			SyncReplicas: 1,
			Pooler:       true,
			VPCID:        "1234567890",
			Running:      true,
			PGVersion:    17,
		},
		Generation: 7,
		Fork: &dbcloud.ForkSource{
			ProjectID:  projectID,
			ServiceID:  "parent0001",
			Strategy:   dbcloud.ForkPITR,
			TargetTime: ptr(created.Add(-time.Hour)),
		},
		PasswordVerifier:   "SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVkS2V5:c2VydmVyS2V5",
		Status:             dbcloud.StatusConfiguring,
		StatusReason:       "resizing primary",
		ObservedGeneration: 6,
		PGVersionFull:      "17.12",
		Endpoint:           &dbcloud.Endpoint{Host: "127.0.0.1", Port: 15432},
		PoolerEndpoint:     &dbcloud.Endpoint{Host: "127.0.0.1", Port: 15433},
		VPCEndpoint: &dbcloud.VPCEndpoint{
			Endpoint: dbcloud.Endpoint{Host: "127.0.0.2", Port: 5432},
			VPCID:    "1234567890",
		},
		Metrics: &dbcloud.Metrics{MilliCPU: 250, MemoryMB: 1024, StorageMB: 42, Measured: created.Add(time.Minute)},
		Instances: []dbcloud.Instance{
			{ID: id + "-1", Role: "primary"},
			{ID: id + "-2", Role: "standby"},
		},
	}
}

func newReplicaSet(projectID, serviceID, id string, created time.Time) *dbcloud.ReadReplicaSet {
	return &dbcloud.ReadReplicaSet{
		ID:        id,
		ProjectID: projectID,
		ServiceID: serviceID,
		Name:      "replicas " + id,
		Created:   created,
		Spec: dbcloud.ReadReplicaSetSpec{
			Size:        dbcloud.Size{CPUMillis: 1000, MemoryGBs: 4},
			Nodes:       3,
			Environment: dbcloud.EnvProd,
			Pooler:      true,
		},
		Generation:         3,
		Status:             dbcloud.ReplicaSetResizing,
		StatusReason:       "adding a node",
		ObservedGeneration: 2,
		Endpoint:           &dbcloud.Endpoint{Host: "127.0.0.1", Port: 16000},
		PoolerEndpoint:     &dbcloud.Endpoint{Host: "127.0.0.1", Port: 16001},
	}
}

func newVPC(projectID, id string, created time.Time) *dbcloud.VPC {
	return &dbcloud.VPC{
		ID:        id,
		ProjectID: projectID,
		Name:      "vpc " + id,
		CIDR:      netip.MustParsePrefix("10.1.0.0/16"),
		Region:    "local",
		Created:   created,
	}
}

func newPeering(projectID, vpcID, id string, created time.Time) *dbcloud.Peering {
	return &dbcloud.Peering{
		ID:             id,
		ProjectID:      projectID,
		VPCID:          vpcID,
		PeerAccountID:  "123456789012",
		PeerRegionCode: "us-east-1",
		PeerVPCID:      "vpc-0abc",
		Status:         dbcloud.PeeringFailed,
		ErrorMessage:   "peer refused",
		ProvisionedID:  "pcx-123",
		Created:        created,
	}
}

func newOperation(projectID, resourceID, id string, state dbcloud.OperationState, created time.Time) *dbcloud.Operation {
	return &dbcloud.Operation{
		ID:           id,
		ProjectID:    projectID,
		ResourceID:   resourceID,
		Type:         dbcloud.OpResizeService,
		Generation:   4,
		State:        state,
		Error:        "attempt 2 failed",
		Attempts:     2,
		Created:      created,
		Updated:      created.Add(time.Second),
		LeaseOwner:   "worker-1",
		LeaseExpires: created.Add(time.Minute),
	}
}

func newIdempotency(credential, key string, created time.Time) *dbcloud.IdempotencyRecord {
	return &dbcloud.IdempotencyRecord{
		Credential:   credential,
		Key:          key,
		Method:       "POST",
		Path:         "/projects/p1/services",
		RequestHash:  "a1b2c3",
		ResourceKind: "service",
		ResourceID:   "svc0000001",
		Status:       202,
		Response:     []byte{0, 1, 2, 0xff, 'x'},
		Created:      created,
	}
}

// SucceedPending marks the pending operations of resourceID (of every
// resource when it is empty) succeeded, as the engine would: tests of the
// layers above it settle their fixtures with it.
func SucceedPending(tx dbcloud.Tx, resourceID string) error {
	ops, err := tx.ListOperations(dbcloud.OperationFilter{ResourceID: resourceID, Pending: true})
	if err != nil {
		return err
	}
	for _, op := range ops {
		op.State = dbcloud.OpSucceeded
		if err := tx.UpdateOperation(op); err != nil {
			return err
		}
	}
	return nil
}
