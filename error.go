package dbcloud

import (
	"errors"
	"fmt"
	"time"
)

// ErrorKind classifies a domain error. The HTTP layer maps each kind to one
// status code in exactly one table; nothing else decides a status.
type ErrorKind int

// Error kinds. They follow the codes of decisions.md section 1.
const (
	KindInternal ErrorKind = iota
	KindInvalid
	KindUnauthorized
	KindForbidden
	KindNotFound
	KindConflict
	KindRateLimited
	KindUnavailable
)

// Wire codes that say more than the kind's default code. Clients branch on
// them, so they never change once published.
const (
	CodeAddonUnavailable      = "ADDON_UNAVAILABLE"
	CodeCIDRConflict          = "CIDR_CONFLICT"
	CodeDeleteProtected       = "DELETE_PROTECTED"
	CodeOperationInProgress   = "OPERATION_IN_PROGRESS"
	CodeIdempotencyKeyReused  = "IDEMPOTENCY_KEY_REUSED"
	CodeIdempotencyInProgress = "IDEMPOTENCY_KEY_IN_PROGRESS"
	CodeQuotaExceeded         = "QUOTA_EXCEEDED"
	CodeCapacityExceeded      = "CAPACITY_EXCEEDED"
)

// Error is an error a caller can act on: its message is safe to show and
// says what was wrong and what is allowed. Any other error reaching the HTTP
// layer is reported as "Internal error." and logged in full.
type Error struct {
	Kind    ErrorKind
	Code    string // optional; the kind's default code when empty
	Message string
	// RetryAfter, when set, tells the client when a retry can succeed.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Code != "" {
		return e.Code + ": " + e.Message
	}
	return e.Message
}

// Errorf returns a domain error of the given kind.
func Errorf(kind ErrorKind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// CodedErrorf returns a domain error with a specific wire code.
func CodedErrorf(kind ErrorKind, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorKindOf returns the kind of err, KindInternal when it is not a domain error.
func ErrorKindOf(err error) ErrorKind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// IsNotFound reports whether err is a domain not-found error.
func IsNotFound(err error) bool { return err != nil && ErrorKindOf(err) == KindNotFound }

// IsConflict reports whether err is a domain conflict error.
func IsConflict(err error) bool { return err != nil && ErrorKindOf(err) == KindConflict }

// ErrNotFound is returned by stores when a row does not exist. Callers wrap
// it into a message that names the resource.
var ErrNotFound = &Error{Kind: KindNotFound, Message: "Not found."}

// ErrDuplicate is returned by stores when a unique key already exists.
var ErrDuplicate = &Error{Kind: KindConflict, Message: "Already exists."}

// ErrStoreFull is returned by stores when the disk under the store is
// full: nothing was written, reads still answer, and a retry succeeds once
// space is freed.
var ErrStoreFull = &Error{Kind: KindUnavailable, RetryAfter: 30 * time.Second,
	Message: "The control plane's disk is full: changes are refused until space is freed; reads still answer. Retry later."}
