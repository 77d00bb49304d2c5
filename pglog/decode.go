package pglog

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// decodeRecord fills rec from a jsonlog line exactly as json.Unmarshal
// would, and answers the same error or none. Decoding is most of what a
// page costs once the block is read, and the reflection of json.Unmarshal
// is most of decoding: the lines the logging collector writes (a flat
// object of plain strings and numbers) are read here directly, and any
// other line, as well as anything this reader is not sure of, goes to
// json.Unmarshal, which then decides.
func decodeRecord(line []byte, rec *record) error {
	if fastRecord(line, rec) {
		return nil
	}
	*rec = record{}
	return json.Unmarshal(line, rec)
}

// fastRecord reads a flat JSON object whose values are strings without
// escapes and numbers; false, with rec in any state, for anything else.
func fastRecord(line []byte, rec *record) bool {
	*rec = record{}
	i := skipSpace(line, 0)
	if i >= len(line) || line[i] != '{' {
		return false
	}
	i = skipSpace(line, i+1)
	if i < len(line) && line[i] == '}' {
		return onlySpace(line, i+1)
	}
	for {
		key, next, ok := plainString(line, i)
		if !ok {
			return false
		}
		field, ok := recordField(rec, key)
		if !ok {
			return false
		}
		i = skipSpace(line, next)
		if i >= len(line) || line[i] != ':' {
			return false
		}
		i = skipSpace(line, i+1)
		if i >= len(line) {
			return false
		}
		if line[i] == '"' {
			val, next, ok := plainString(line, i)
			if !ok {
				return false
			}
			if field != nil {
				*field = string(val)
			}
			i = next
		} else {
			if field != nil {
				return false // json.Unmarshal refuses a number here
			}
			next, ok := number(line, i)
			if !ok {
				return false
			}
			i = next
		}
		i = skipSpace(line, i)
		if i >= len(line) {
			return false
		}
		switch line[i] {
		case ',':
			i = skipSpace(line, i+1)
		case '}':
			return onlySpace(line, i+1)
		default:
			return false
		}
	}
}

// recordField returns where the value of key goes: nil for a key record
// does not keep; false for a key json.Unmarshal might match to a field
// although it is not spelled as its tag (it matches case-insensitively,
// with Unicode folds), which is left to it.
func recordField(rec *record, key []byte) (*string, bool) {
	switch string(key) {
	case "timestamp":
		return &rec.Timestamp, true
	case "error_severity":
		return &rec.Severity, true
	case "message":
		return &rec.Message, true
	case "user":
		return &rec.User, true
	}
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return nil, false
		}
	}
	for _, name := range []string{"timestamp", "error_severity", "message", "user"} {
		if bytes.EqualFold(key, []byte(name)) {
			return nil, false
		}
	}
	return nil, true
}

// plainString returns the contents of the string at line[i] (a '"') and
// the index after it, when it has no escape, no control character and is
// valid UTF-8: then its bytes are its value.
func plainString(line []byte, i int) ([]byte, int, bool) {
	if i >= len(line) || line[i] != '"' {
		return nil, 0, false
	}
	end := bytes.IndexByte(line[i+1:], '"')
	if end < 0 {
		return nil, 0, false
	}
	s := line[i+1 : i+1+end]
	ascii := true
	for _, c := range s {
		if c < 0x20 || c == '\\' {
			return nil, 0, false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(s) {
		return nil, 0, false
	}
	return s, i + 1 + end + 1, true
}

// number returns the index after the JSON number at line[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(line []byte, i int) (int, bool) {
	if i < len(line) && line[i] == '-' {
		i++
	}
	switch {
	case i < len(line) && line[i] == '0':
		i++
	case i < len(line) && '1' <= line[i] && line[i] <= '9':
		i = digits(line, i)
	default:
		return 0, false
	}
	if i < len(line) && line[i] == '.' {
		j := digits(line, i+1)
		if j == i+1 {
			return 0, false
		}
		i = j
	}
	if i < len(line) && (line[i] == 'e' || line[i] == 'E') {
		i++
		if i < len(line) && (line[i] == '+' || line[i] == '-') {
			i++
		}
		j := digits(line, i)
		if j == i {
			return 0, false
		}
		i = j
	}
	return i, true
}

func digits(line []byte, i int) int {
	for i < len(line) && '0' <= line[i] && line[i] <= '9' {
		i++
	}
	return i
}

func skipSpace(line []byte, i int) int {
	for i < len(line) && (line[i] == ' ' || line[i] == '\t' || line[i] == '\n' || line[i] == '\r') {
		i++
	}
	return i
}

func onlySpace(line []byte, i int) bool { return skipSpace(line, i) == len(line) }
