package http

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"

	"dbcloud/cloud"

	"dbcloud"
)

// idempotent serves a POST or DELETE that carries an Idempotency-Key
// (decisions.md section 1). The domain records the key in the same
// transaction as the change, so a retry can never repeat the change; the
// first response is then stored, sealed for the caller, and replayed.
// Only successful responses are kept: a refused request changed nothing, so
// its retry is simply judged again.
func (h *Handler) idempotent(w http.ResponseWriter, r *http.Request, rt Route, p *dbcloud.Principal, secret, key string, body []byte) {
	ctx := r.Context()
	if !validIdempotencyKey(key) {
		writeError(w, r, h.logger, dbcloud.Errorf(dbcloud.KindInvalid, "Idempotency-Key must be 1 to 255 printable ASCII characters."))
		return
	}
	sum := sha256.Sum256([]byte(r.Method + "\n" + r.URL.Path + "\n" + string(body)))
	hash := hex.EncodeToString(sum[:])
	rec, err := h.cloud.FindIdempotency(ctx, p.ID(), key)
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	if rec != nil {
		if rec.Method != r.Method || rec.Path != r.URL.Path || rec.RequestHash != hash {
			writeError(w, r, h.logger, dbcloud.CodedErrorf(dbcloud.KindConflict, dbcloud.CodeIdempotencyKeyReused,
				"Idempotency-Key %q was used for a different request (%s %s); use a new key for a new request.", key, rec.Method, rec.Path))
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		operationHeaders(w, r, &cloud.OperationLog{ID: rec.OperationID})
		if rec.Response != nil {
			plain, err := unseal(secret, rec.Response)
			if err != nil {
				writeError(w, r, h.logger, err)
				return
			}
			if len(plain) == 0 {
				plain = nil
			}
			writeRaw(w, rec.Status, plain)
			return
		}
		if rec.ResourceKind != "" {
			// The change was made but its response was never stored (the
			// server stopped in between): answer from what it created.
			status, out, err := h.created(r, rec, secret)
			if err != nil {
				writeError(w, r, h.logger, err)
				return
			}
			writeResult(w, status, out)
			return
		}
		// A change to an existing resource is in effect already, so running
		// the request again is a no-op that yields the right response.
	}
	claim := &dbcloud.IdempotencyRecord{
		Credential: p.ID(), Key: key, Method: r.Method, Path: r.URL.Path, RequestHash: hash,
		Seal: func(plain []byte) ([]byte, error) { return seal(secret, plain) },
	}
	if rec == nil {
		r = r.WithContext(cloud.NewContextWithIdempotency(ctx, claim))
	}
	status, out, err := rt.fn(w, r)
	if err != nil {
		writeError(w, r, h.logger, err)
		return
	}
	if h.AfterIdempotentChange != nil {
		h.AfterIdempotentChange()
	}
	var b []byte
	if out != nil {
		if b, err = json.Marshal(out); err != nil {
			writeError(w, r, h.logger, err)
			return
		}
	}
	claim.Status = status
	if l := cloud.OperationLogFromContext(r.Context()); l != nil {
		claim.OperationID = l.ID
	}
	if claim.Response, err = seal(secret, b); err == nil {
		err = h.cloud.CompleteIdempotency(ctx, claim)
	}
	if err != nil {
		// The change is made and recorded with its key; only the replay of
		// this exact body is lost, and a retry answers from the resource.
		h.logger.WarnContext(ctx, "idempotent response not stored", "request_id", requestID(ctx), "error", err)
	}
	operationHeaders(w, r, &cloud.OperationLog{ID: claim.OperationID})
	writeRaw(w, status, b)
}

// created renders the resource a request created, with the status a create answers.
// A create's initial password was sealed with the change, so it is in the
// answer too.
func (h *Handler) created(r *http.Request, rec *dbcloud.IdempotencyRecord, secret string) (int, any, error) {
	ctx, pid := r.Context(), r.PathValue("project_id")
	switch rec.ResourceKind {
	case "service":
		v, err := h.cloud.GetService(ctx, pid, rec.ResourceID)
		if err != nil {
			return 0, nil, err
		}
		if rec.Secret != nil {
			pw, err := unseal(secret, rec.Secret)
			if err != nil {
				return 0, nil, err
			}
			v.InitialPassword = string(pw)
		}
		return http.StatusAccepted, toService(v), nil
	case "replica_set":
		rs, err := h.cloud.GetReplicaSet(ctx, pid, r.PathValue("service_id"), rec.ResourceID)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusAccepted, toReplicaSet(rs), nil
	case "vpc":
		v, err := h.cloud.GetVPC(ctx, pid, rec.ResourceID)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusCreated, toVPC(v), nil
	case "peering":
		p, err := h.cloud.GetPeering(ctx, pid, r.PathValue("vpc_id"), rec.ResourceID)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusCreated, toPeering(p), nil
	}
	return 0, nil, errors.New("idempotency record of unknown resource kind " + rec.ResourceKind)
}

func validIdempotencyKey(k string) bool {
	if len(k) < 1 || len(k) > 255 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// sealer is the AEAD that seals stored responses, keyed from the caller's
// secret, which the server does not keep: a stored response (it may hold
// an initial password) can be opened only when the same caller retries.
func sealer(secret string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(secret), nil, "dbcloud idempotent response", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func seal(secret string, plain []byte) ([]byte, error) {
	gcm, err := sealer(secret)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, gcm.NonceSize())
	rand.Read(nonce)
	return gcm.Seal(nonce, nonce, plain, nil), nil
}

func unseal(secret string, sealed []byte) ([]byte, error) {
	gcm, err := sealer(secret)
	if err != nil {
		return nil, err
	}
	if len(sealed) < gcm.NonceSize() {
		return nil, errors.New("sealed response too short")
	}
	plain, err := gcm.Open(nil, sealed[:gcm.NonceSize()], sealed[gcm.NonceSize():], nil)
	if err != nil {
		// Only another secret of the same credential gets here: a user's
		// OAuth access token refreshed since the first request.
		return nil, dbcloud.Errorf(dbcloud.KindConflict, "The first request with this Idempotency-Key was made, but its response is sealed for the access token that sent it, which has since been refreshed; look the resource up instead of retrying.")
	}
	return plain, nil
}
