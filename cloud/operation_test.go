package cloud

import (
	"context"
	"testing"

	"dbcloud"
)

// An operation records who asked: a key (and the user it acts for), a
// signed-in user, or the operator; never the operator for a user.
func TestRequesterOf(t *testing.T) {
	p := &dbcloud.Project{ID: "p1"}
	user := &dbcloud.User{ID: "u1", Email: "ada@example.com"}
	for _, c := range []struct {
		name string
		ctx  context.Context
		want dbcloud.Requester
	}{
		{"key", NewContextWithPrincipal(context.Background(), &dbcloud.Principal{Key: &dbcloud.APIKey{AccessKey: "k1"}, User: user}),
			dbcloud.Requester{AccessKey: "k1", UserID: "u1", UserEmail: "ada@example.com"}},
		{"user token", NewContextWithPrincipal(context.Background(), &dbcloud.Principal{User: user}),
			dbcloud.Requester{UserID: "u1", UserEmail: "ada@example.com"}},
		{"operator", OperatorContext(context.Background(), p), dbcloud.Requester{System: operatorRequester}},
		{"nobody", context.Background(), dbcloud.Requester{System: "dbcloud"}},
	} {
		if got := requesterOf(c.ctx); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if role, ok := PrincipalFromContext(OperatorContext(context.Background(), p)).RoleIn("p1"); !ok || role != "owner" {
		t.Errorf("the operator's role in its project: %q %v, want owner", role, ok)
	}
}
