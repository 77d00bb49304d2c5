package cloud

import (
	"context"

	"dbcloud"
	"dbcloud/identity"
)

// ChangeOwnPassword sets the signed-in person's password after checking
// the current one. Every other console session and command-line login of
// theirs ends: whoever knew the old password may have used it. The
// session that asked stays.
func (c *Cloud) ChangeOwnPassword(ctx context.Context, current, next string) error {
	p := PrincipalFromContext(ctx)
	if p == nil || p.User == nil || p.Key != nil || p.Token == nil {
		return dbcloud.Errorf(dbcloud.KindUnauthorized, "Only a signed-in person can change their own password.")
	}
	if err := identity.CheckPassword(next); err != nil {
		return dbcloud.Errorf(dbcloud.KindInvalid, "new_password: %s.", err)
	}
	var u *dbcloud.User
	err := c.Store.View(ctx, func(tx dbcloud.Tx) (err error) {
		u, err = tx.FindUser(p.User.ID)
		return err
	})
	if err != nil {
		return err
	}
	// Hashing happens outside the store transaction: it is slow on purpose.
	if ok, err := identity.VerifyPassword(current, u.PasswordHash); err != nil || !ok || u.PasswordHash == "" {
		return dbcloud.Errorf(dbcloud.KindInvalid, "current_password: that is not your current password.")
	}
	hash, err := identity.HashPassword(next, c.passwordParams())
	if err != nil {
		return err
	}
	return c.Store.Update(ctx, func(tx dbcloud.Tx) error {
		now, err := tx.FindUser(u.ID)
		if err != nil {
			return err
		}
		if now.PasswordHash != u.PasswordHash {
			return dbcloud.Errorf(dbcloud.KindConflict, "Your password was changed meanwhile; sign in again with the new one.")
		}
		now.PasswordHash = hash
		if err := tx.UpdateUser(now); err != nil {
			return err
		}
		toks, err := tx.ListUserTokens(u.ID)
		if err != nil {
			return err
		}
		others := toks[:0]
		for _, t := range toks {
			if t.Family != p.Token.Family {
				others = append(others, t)
			}
		}
		return c.revokeTokens(tx, others)
	})
}
