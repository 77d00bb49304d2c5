package pglog

import (
	"encoding/json"
	"testing"
)

// decodeSeeds are lines decodeRecord must read exactly as json.Unmarshal
// does: what the collector writes, and each way a line may leave the
// direct path (escapes, other value kinds, keys json.Unmarshal matches
// case-insensitively or through Unicode folds, broken syntax).
var decodeSeeds = []string{
	`{"timestamp":"2026-11-21 23:19:17.095 UTC","user":"tsdbadmin","dbname":"tsdb","pid":123,"error_severity":"LOG","message":"connection authorized","backend_type":"client backend","query_id":0}` + "\n",
	`{"timestamp":"2026-11-21 23:19:17.095 UTC","pid":-1.5e+3,"error_severity":"WARNING","message":"d\u00e9j\u00e0 \"quoted\" \\ back"}` + "\n",
	`{"timestamp":"2026-11-21 23:19:17.095 UTC","message":"héllo wörld ☃"}`,
	`{"message":"a","message":"b"}`,
	`{"Message":"upper"}`,
	`{"MESSAGE":"upper","user":"x"}`,
	"{\"us\u017fer\":\"long s\"}",
	"{\"\u212aey\":1,\"message\":\"kelvin key\"}",
	`{"message":5}`,
	`{"message":null}`,
	`{"message":true}`,
	`{"other":null,"message":"m"}`,
	`{"other":{"nested":"x"},"message":"m"}`,
	`{"other":[1,2],"message":"m"}`,
	`{"pid":01}`,
	`{"pid":1.}`,
	`{"pid":-}`,
	`{"pid":1e}`,
	`{"pid":1E+9}`,
	`{"message":"m"} x`,
	`{"message":"m"`,
	`{"message":"m",}`,
	`{"message" : "spaced" , "user" :"u" }` + " \r\n",
	`{}`,
	` { } `,
	`[]`,
	``,
	"{\"message\":\"tab\there\"}",
	"{\"message\":\"bad \xff utf8\"}",
	"{\"m\xffessage\":\"bad key\"}",
	`{"message":"unterminated}`,
	`{"timestamp":"x","user":""}`,
	`not json`,
}

// TestDecodeRecord_AsUnmarshal: for every seed, decodeRecord gives the
// record and the error (or none) json.Unmarshal gives.
func TestDecodeRecord_AsUnmarshal(t *testing.T) {
	for _, s := range decodeSeeds {
		checkDecode(t, []byte(s))
	}
}

// FuzzDecodeRecord holds decodeRecord to json.Unmarshal on any line.
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) { checkDecode(t, line) })
}

func checkDecode(t *testing.T, line []byte) {
	t.Helper()
	var want, got record
	wantErr := json.Unmarshal(line, &want)
	gotErr := decodeRecord(line, &got)
	if (wantErr == nil) != (gotErr == nil) {
		t.Fatalf("%q: decodeRecord error %v, json.Unmarshal error %v", line, gotErr, wantErr)
	}
	if wantErr == nil && got != want {
		t.Fatalf("%q: decodeRecord %+v, json.Unmarshal %+v", line, got, want)
	}
}

// BenchmarkDecodeRecord decodes a line of the benchmark data's kind with
// decodeRecord and, beside it, with json.Unmarshal (what it replaces).
func BenchmarkDecodeRecord(b *testing.B) {
	line := []byte(decodeSeeds[0])
	b.Run("decodeRecord", func(b *testing.B) {
		for b.Loop() {
			var rec record
			if err := decodeRecord(line, &rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}
