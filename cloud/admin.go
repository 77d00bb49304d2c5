package cloud

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/mail"
	"strings"

	"dbcloud"

	"dbcloud/identity"
)

// Admin operations run from the server binary on the host (`dbcloud admin`),
// before a console exists. They have no principal: whoever can open the
// store is the operator.

// NewAPIKey is a freshly issued key. Secret is shown once and never stored.
type NewAPIKey struct {
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
	ProjectID string `json:"project_id"`
}

// Bootstrap is what the first start of an empty store creates, so that a
// newcomer can call the API at once.
type Bootstrap struct {
	User    *dbcloud.User
	Project *dbcloud.Project
	Key     *NewAPIKey
	// Password is the owner's console password, shown once.
	Password string
}

// Bootstrap creates the admin user, a default project and an API key when
// the store has no project yet. It returns nil when there is nothing to do.
func (c *Cloud) Bootstrap(ctx context.Context, adminName, adminEmail string) (*Bootstrap, error) {
	if _, err := mail.ParseAddress(adminEmail); err != nil || !strings.Contains(adminEmail[strings.LastIndex(adminEmail, "@")+1:], ".") {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "admin e-mail %q is not an address with a dotted domain.", adminEmail)
	}
	var b *Bootstrap
	err := c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		projects, err := tx.ListProjects()
		if err != nil || len(projects) > 0 {
			return err
		}
		u, err := c.adminUser(tx, adminName, adminEmail)
		if err != nil {
			return err
		}
		p := &dbcloud.Project{ID: dbcloud.NewID(), Name: "default", PlanType: "self-hosted", Created: c.now()}
		if err := tx.InsertProject(p); err != nil {
			return err
		}
		if err := c.makeOwner(tx, p.ID, u.ID); err != nil {
			return err
		}
		k, err := c.issueKey(tx, p.ID, u.ID, "bootstrap", identity.Owner)
		if err != nil {
			return err
		}
		b = &Bootstrap{User: u, Project: p, Key: k}
		if u.PasswordHash == "" {
			// The first owner signs in to the console with this; the hash
			// is slow, but it happens once in the store's life.
			b.Password = identity.NewPassword()
			if u.PasswordHash, err = identity.HashPassword(b.Password, c.passwordParams()); err != nil {
				return err
			}
			return tx.UpdateUser(u)
		}
		return nil
	})
	return b, err
}

// makeOwner makes the user an owner of the project.
func (c *Cloud) makeOwner(tx dbcloud.Tx, projectID, userID string) error {
	m, err := tx.FindMembership(projectID, userID)
	if dbcloud.IsNotFound(err) {
		return tx.InsertMembership(&dbcloud.Membership{ProjectID: projectID, UserID: userID, Role: identity.Owner, Created: c.now()})
	} else if err != nil {
		return err
	}
	m.Role = identity.Owner
	return tx.UpdateMembership(m)
}

// adminUser returns the installation's admin user, creating it with the store.
func (c *Cloud) adminUser(tx dbcloud.Tx, name, email string) (*dbcloud.User, error) {
	users, err := tx.ListUsers()
	if err != nil {
		return nil, err
	}
	if len(users) > 0 {
		return users[0], nil
	}
	u := &dbcloud.User{ID: dbcloud.NewID(), Name: name, Email: email, Created: c.now()}
	return u, tx.InsertUser(u)
}

// CreateProject creates a project.
func (c *Cloud) CreateProject(ctx context.Context, name, adminName, adminEmail string) (*dbcloud.Project, error) {
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	p := &dbcloud.Project{ID: dbcloud.NewID(), Name: name, PlanType: "self-hosted", Created: c.now()}
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		u, err := c.adminUser(tx, adminName, adminEmail)
		if err != nil {
			return err
		}
		if err := tx.InsertProject(p); err != nil {
			return err
		}
		return c.makeOwner(tx, p.ID, u.ID)
	})
	return p, err
}

// CreateAPIKey issues an owner key for a project, on behalf of the admin user.
func (c *Cloud) CreateAPIKey(ctx context.Context, projectID, name, adminName, adminEmail string) (*NewAPIKey, error) {
	return c.CreateAPIKeyWithRole(ctx, projectID, name, identity.Owner, adminName, adminEmail)
}

// CreateAPIKeyWithRole issues a key of the role for a project, on behalf of
// the admin user (dbcloud admin key create --role).
func (c *Cloud) CreateAPIKeyWithRole(ctx context.Context, projectID, name string, role identity.Role, adminName, adminEmail string) (*NewAPIKey, error) {
	name, err := dbcloud.NormalName("name", name)
	if err != nil {
		return nil, err
	}
	if !role.Valid() {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid, "role must be one of viewer, developer, admin, owner; got %q.", role)
	}
	var k *NewAPIKey
	err = c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		if _, err := tx.FindProject(projectID); err != nil {
			if dbcloud.IsNotFound(err) {
				return dbcloud.Errorf(dbcloud.KindNotFound, "Project %q not found.", projectID)
			}
			return err
		}
		u, err := c.adminUser(tx, adminName, adminEmail)
		if err != nil {
			return err
		}
		// The operator's keys act for the admin user, who owns the project.
		if err := c.makeOwner(tx, projectID, u.ID); err != nil {
			return err
		}
		k, err = c.issueKey(tx, projectID, u.ID, name, role)
		return err
	})
	return k, err
}

func (c *Cloud) issueKey(tx dbcloud.Tx, projectID, userID, name string, role identity.Role) (*NewAPIKey, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("random secret: %w", err)
	}
	secret := base64.RawURLEncoding.EncodeToString(raw)
	k := &dbcloud.APIKey{
		AccessKey: dbcloud.NewAccessKey(), ProjectID: projectID, UserID: userID, Name: name, Role: role,
		SecretHash: dbcloud.HashSecret(secret), Created: c.now(),
	}
	if err := tx.InsertAPIKey(k); err != nil {
		return nil, err
	}
	return &NewAPIKey{AccessKey: k.AccessKey, SecretKey: secret, ProjectID: projectID}, nil
}

// ListAPIKeys lists a project's keys (never their secrets).
func (c *Cloud) ListAPIKeys(ctx context.Context, projectID string) ([]*dbcloud.APIKey, error) {
	var out []*dbcloud.APIKey
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListAPIKeys(projectID)
		return err
	})
	return out, err
}

// RevokeAPIKey revokes a key; its next request fails.
func (c *Cloud) RevokeAPIKey(ctx context.Context, accessKey string) error {
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		k, err := tx.FindAPIKey(accessKey)
		if dbcloud.IsNotFound(err) {
			return dbcloud.Errorf(dbcloud.KindNotFound, "API key %q not found.", accessKey)
		} else if err != nil {
			return err
		}
		return c.revokeKey(tx, k)
	})
}

// ListProjectsAdmin lists every project, for the operator.
func (c *Cloud) ListProjectsAdmin(ctx context.Context) ([]*dbcloud.Project, error) {
	var out []*dbcloud.Project
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		out, err = tx.ListProjects()
		return err
	})
	return out, err
}
