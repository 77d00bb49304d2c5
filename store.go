package dbcloud

import (
	"context"
	"time"
)

// Store keeps all state. Each call of View or Update is one transaction, so
// the domain can read, decide and write atomically; the rules themselves live
// in Cloud, once, and not in each store implementation.
type Store interface {
	// View runs fn in a read-only transaction.
	View(ctx context.Context, fn func(Tx) error) error
	// Update runs fn in a read-write transaction, committed when fn returns nil.
	Update(ctx context.Context, fn func(Tx) error) error
	Close() error
}

// Tx is one store transaction. Finders return ErrNotFound for missing rows;
// inserts return ErrDuplicate for an existing key.
type Tx interface {
	InsertUser(u *User) error
	FindUser(id string) (*User, error)
	ListUsers() ([]*User, error)

	// FindUserByEmail finds a user by e-mail address, ignoring case.
	FindUserByEmail(email string) (*User, error)
	UpdateUser(u *User) error

	InsertMembership(m *Membership) error
	FindMembership(projectID, userID string) (*Membership, error)
	// ListMembers lists a project's members, oldest first.
	ListMembers(projectID string) ([]*Membership, error)
	// ListMemberships lists the projects a user belongs to, oldest first.
	ListMemberships(userID string) ([]*Membership, error)
	UpdateMembership(m *Membership) error
	DeleteMembership(projectID, userID string) error

	// User tokens (OAuth codes, access and refresh tokens, console
	// sessions) are found by the hash of their secret only.
	InsertUserToken(t *UserToken) error
	FindUserToken(hash []byte) (*UserToken, error)
	UpdateUserToken(t *UserToken) error
	// ListTokenFamily lists the tokens of one login, oldest first.
	ListTokenFamily(family string) ([]*UserToken, error)
	// ListUserTokens lists every token of a user, oldest first.
	ListUserTokens(userID string) ([]*UserToken, error)
	// DeleteUserTokensBefore deletes tokens that expired before t.
	DeleteUserTokensBefore(t time.Time) (int, error)

	InsertProject(p *Project) error
	FindProject(id string) (*Project, error)
	ListProjects() ([]*Project, error)
	UpdateProject(p *Project) error
	// LockProject serialises writers of one project, so that checks such as
	// quotas and CIDR overlap hold under concurrent requests.
	LockProject(id string) error

	InsertAPIKey(k *APIKey) error
	FindAPIKey(accessKey string) (*APIKey, error)
	ListAPIKeys(projectID string) ([]*APIKey, error)
	UpdateAPIKey(k *APIKey) error
	// TouchAPIKey records that the key was used at, unless a later use
	// is recorded already. It changes no credential (RevisionCredentials
	// stays), so verified keys stay verified.
	TouchAPIKey(accessKey string, at time.Time) error

	// Invitations are found by ID within their project, or by the hash
	// of their token only.
	InsertInvitation(i *Invitation) error
	FindInvitation(projectID, id string) (*Invitation, error)
	FindInvitationByHash(hash []byte) (*Invitation, error)
	// ListInvitations lists a project's invitations, oldest first.
	ListInvitations(projectID string) ([]*Invitation, error)
	UpdateInvitation(i *Invitation) error

	InsertService(s *Service) error
	FindService(projectID, id string) (*Service, error)
	ListServices(projectID string) ([]*Service, error)
	UpdateService(s *Service) error
	DeleteService(projectID, id string) error

	InsertReplicaSet(r *ReadReplicaSet) error
	FindReplicaSet(projectID, id string) (*ReadReplicaSet, error)
	// ListReplicaSets lists a project's sets; serviceID "" means all of them.
	ListReplicaSets(projectID, serviceID string) ([]*ReadReplicaSet, error)
	UpdateReplicaSet(r *ReadReplicaSet) error
	DeleteReplicaSet(projectID, id string) error

	InsertVPC(v *VPC) error
	FindVPC(projectID, id string) (*VPC, error)
	ListVPCs(projectID string) ([]*VPC, error)
	UpdateVPC(v *VPC) error
	DeleteVPC(projectID, id string) error

	// Credentials of a service; ListCredentials with serviceID "" lists
	// the project's, with projectID "" too every project's.
	InsertCredential(c *Credential) error
	FindCredential(projectID, serviceID, id string) (*Credential, error)
	ListCredentials(projectID, serviceID string) ([]*Credential, error)
	UpdateCredential(c *Credential) error
	DeleteCredential(projectID, serviceID, id string) error

	InsertPeering(p *Peering) error
	FindPeering(vpcID, id string) (*Peering, error)
	ListPeerings(vpcID string) ([]*Peering, error)
	UpdatePeering(p *Peering) error
	DeletePeering(vpcID, id string) error

	InsertOperation(op *Operation) error
	FindOperation(id string) (*Operation, error)
	ListOperations(f OperationFilter) ([]*Operation, error)
	UpdateOperation(op *Operation) error
	// DeleteOperationsBefore deletes the terminal operations last updated
	// before t and returns how many it deleted.
	DeleteOperationsBefore(t time.Time) (int, error)

	// InsertEvent records e and sets e.ID to the project's next event ID:
	// IDs of one project increase by one in commit order.
	InsertEvent(e *Event) error
	// ListEvents returns up to limit events of the project with IDs above
	// after, oldest first.
	ListEvents(projectID string, after int64, limit int) ([]*Event, error)
	// DeleteEventsBefore deletes events older than t and returns how many.
	DeleteEventsBefore(t time.Time) (int, error)

	// ListPorts returns the claimed endpoint ports and their owners.
	ListPorts() (map[int]string, error)
	// ClaimPort records that owner holds port; ErrDuplicate if it is held.
	ClaimPort(port int, owner string) error
	// ReleasePorts frees every port owner holds.
	ReleasePorts(owner string) error

	// AcquireLease gives owner the resource until expires, if no other owner
	// holds an unexpired lease on it; it reports whether owner holds it now.
	// An owner may renew its own lease the same way.
	AcquireLease(resourceID, owner string, now, expires time.Time) (bool, error)
	// ReleaseLease ends owner's lease on the resource, if it holds one.
	ReleaseLease(resourceID, owner string) error

	InsertIdempotency(r *IdempotencyRecord) error
	FindIdempotency(credential, key string) (*IdempotencyRecord, error)
	UpdateIdempotency(r *IdempotencyRecord) error
	DeleteIdempotencyBefore(t time.Time) (int, error)
}

// IdempotencyRecord remembers a POST or DELETE sent with an Idempotency-Key.
// It is claimed in the same transaction as the change the request makes, so
// a retry after a timeout can never make the change twice.
type IdempotencyRecord struct {
	Credential   string `json:"credential"`
	Key          string `json:"key"`
	Method       string `json:"method"`
	Path         string `json:"path"`
	RequestHash  string `json:"request_hash"`
	ResourceKind string `json:"resource_kind,omitempty"`
	ResourceID   string `json:"resource_id,omitempty"`
	Status       int    `json:"status,omitempty"`
	// Response is the first response, sealed with a key derived from the
	// caller's secret: it may hold an initial password, and only the same
	// caller can open it.
	Response []byte `json:"response,omitempty"`
	// OperationID is the operation the first request recorded, named
	// again in a replay's headers.
	OperationID string    `json:"operation_id,omitempty"`
	Created     time.Time `json:"created"`
	// Secret is what the response held that cannot be made again (a
	// create's initial password), sealed like Response, and written in the
	// same transaction as the change: a retry after a crash between commit
	// and response still gets it.
	Secret []byte `json:"secret,omitempty"`
	// Seal seals for the caller; set by the transport, never stored.
	Seal func(plain []byte) ([]byte, error) `json:"-"`
}

// IdempotencyTTL is how long a key is remembered (decisions.md section 1).
const IdempotencyTTL = 24 * time.Hour
