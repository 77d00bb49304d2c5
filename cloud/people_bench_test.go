package cloud_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"dbcloud"
	"dbcloud/cloud"
	"dbcloud/identity"
	"dbcloud/sqlite"
)

// BenchmarkHashPassword is the cost of one sign-in's password check at the
// default Argon2id parameters (64 MiB, 3 passes, 1 lane).
func BenchmarkHashPassword(b *testing.B) {
	for b.Loop() {
		if _, err := identity.HashPassword("correct horse battery staple", identity.DefaultPasswordParams); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAuthenticate compares what the API pays per request to
// authenticate an API key and a user's OAuth access token (SQLite store).
func BenchmarkAuthenticate(b *testing.B) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "dbcloud.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := cloud.New(s, nil, cloud.DefaultConfig(), nil)
	c.PasswordParams = &identity.PasswordParams{Time: 1, Memory: 1024, Threads: 1}
	boot, err := c.Bootstrap(ctx, "admin", "admin@example.com")
	if err != nil {
		b.Fatal(err)
	}
	var token string
	err = s.Update(ctx, func(tx dbcloud.Tx) (err error) {
		token, err = c.IssueUserToken(tx, &dbcloud.UserToken{Kind: dbcloud.TokenAccess, UserID: boot.User.ID}, time.Hour)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("key", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Authenticate(ctx, boot.Key.AccessKey, boot.Key.SecretKey); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("token", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.AuthenticateToken(ctx, dbcloud.TokenAccess, token); err != nil {
				b.Fatal(err)
			}
		}
	})
}
