package pglog

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"

	"dbcloud"
)

// cursorVersion changes when the payload's meaning does, so an old cursor
// is refused instead of misread.
const cursorVersion = 1

// wirePosition is a position in a cursor; short names keep cursors short
// in URLs. A cursor holds one per source that still has older matching
// lines; a source without one has none.
type wirePosition struct {
	N int    `json:"n"`
	F string `json:"f"`
	O int64  `json:"o"`
}

// encodeCursor returns base64url(payload || HMAC-SHA256(key, scope, payload)).
func encodeCursor(key []byte, scope string, ps []position) string {
	w := struct {
		V int            `json:"v"`
		P []wirePosition `json:"p"`
	}{V: cursorVersion}
	for _, p := range ps {
		w.P = append(w.P, wirePosition{N: p.Node, F: p.File, O: p.Offset})
	}
	payload, _ := json.Marshal(w) // plain types: cannot fail
	return base64.RawURLEncoding.EncodeToString(append(payload, cursorMAC(key, scope, payload)...))
}

// decodeCursor checks a cursor's signature and returns its positions by
// node.
func decodeCursor(key []byte, scope, cursor string) (map[int]position, error) {
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(raw) <= sha256.Size {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor is malformed; pass lastCursor of a previous response unchanged.")
	}
	payload, mac := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(mac, cursorMAC(key, scope, payload)) {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor was not issued by this server for this service and node filter; pass lastCursor of a previous response unchanged, with the same node.")
	}
	var w struct {
		V int            `json:"v"`
		P []wirePosition `json:"p"`
	}
	if err := json.Unmarshal(payload, &w); err != nil || w.V != cursorVersion {
		return nil, dbcloud.Errorf(dbcloud.KindInvalid,
			"The cursor comes from another version of this server; read again without a cursor.")
	}
	out := make(map[int]position, len(w.P))
	for _, p := range w.P {
		if _, dup := out[p.N]; dup || !validFileName(p.F) || p.O < 0 {
			return nil, dbcloud.Errorf(dbcloud.KindInvalid, "The cursor is malformed; read again without a cursor.")
		}
		out[p.N] = position{Node: p.N, File: p.F, Offset: p.O}
	}
	return out, nil
}

// cursorMAC signs the scope with the payload, so a cursor is only good for
// the scope it was made for.
func cursorMAC(key []byte, scope string, payload []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(scope))
	m.Write([]byte{0})
	m.Write(payload)
	return m.Sum(nil)
}
