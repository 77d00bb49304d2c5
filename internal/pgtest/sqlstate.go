package pgtest

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLState returns err's SQLSTATE; "" when err is nil (the statement
// succeeded); and a sentence quoting err when it is not the server's, so a
// test comparing it with a code fails with the reason.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	if err != nil {
		return "not a server error: " + err.Error()
	}
	return ""
}
