package main

import (
	"strings"
	"testing"
)

// A run's events as `go test -json` writes them: one package passing, one
// with a failing test, one without tests, and a compile error.
const run = `{"Action":"start","Package":"dbcloud/a"}
{"Action":"run","Package":"dbcloud/a","Test":"TestQuick"}
{"Action":"output","Package":"dbcloud/a","Test":"TestQuick","Output":"=== RUN   TestQuick\n"}
{"Action":"output","Package":"dbcloud/a","Test":"TestQuick","Output":"    a_test.go:9: chatter of a passing test\n"}
{"Action":"pass","Package":"dbcloud/a","Test":"TestQuick","Elapsed":0.5}
{"Action":"run","Package":"dbcloud/a","Test":"TestSlow"}
{"Action":"run","Package":"dbcloud/a","Test":"TestSlow/sub"}
{"Action":"pass","Package":"dbcloud/a","Test":"TestSlow/sub","Elapsed":90}
{"Action":"pass","Package":"dbcloud/a","Test":"TestSlow","Elapsed":91.25}
{"Action":"output","Package":"dbcloud/a","Output":"PASS\n"}
{"Action":"output","Package":"dbcloud/a","Output":"ok  \tdbcloud/a\t92.1s\n"}
{"Action":"pass","Package":"dbcloud/a","Elapsed":92.1}
{"Action":"run","Package":"dbcloud/b","Test":"TestBroken"}
{"Action":"output","Package":"dbcloud/b","Test":"TestBroken","Output":"=== RUN   TestBroken\n"}
{"Action":"output","Package":"dbcloud/b","Test":"TestBroken","Output":"    b_test.go:7: want 2, got 3\n"}
{"Action":"output","Package":"dbcloud/b","Test":"TestBroken","Output":"--- FAIL: TestBroken (3.00s)\n"}
{"Action":"fail","Package":"dbcloud/b","Test":"TestBroken","Elapsed":3}
{"Action":"output","Package":"dbcloud/b","Output":"FAIL\tdbcloud/b\t3.2s\n"}
{"Action":"fail","Package":"dbcloud/b","Elapsed":3.2}
{"Action":"output","Package":"dbcloud/c","Output":"?   \tdbcloud/c\t[no test files]\n"}
{"Action":"skip","Package":"dbcloud/c","Elapsed":0}
{"ImportPath":"dbcloud/d","Action":"build-output","Output":"d/d.go:3:1: syntax error\n"}
{"ImportPath":"dbcloud/d","Action":"build-fail"}
`

func TestSummarize(t *testing.T) {
	var out strings.Builder
	failed, err := summarize(strings.NewReader(run), &out, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("a failed test and a failed build were not reported as a failure")
	}
	got := out.String()
	for _, want := range []string{
		"ok  \tdbcloud/a\t92.1s\n",
		"    b_test.go:7: want 2, got 3\n--- FAIL: TestBroken (3.00s)\n",
		"FAIL\tdbcloud/b\t3.2s\n",
		"?   \tdbcloud/c\t[no test files]\n",
		"d/d.go:3:1: syntax error\n",
		"slowest 2 of 3 tests:\n    91.2 s  dbcloud/a TestSlow\n     3.0 s  dbcloud/b TestBroken (failed)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "chatter of a passing test") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
}

func TestSummarize_AllPass(t *testing.T) {
	in := `{"Action":"pass","Package":"dbcloud/a","Test":"TestX","Elapsed":1}
{"Action":"output","Package":"dbcloud/a","Output":"ok  \tdbcloud/a\t1.0s\n"}
{"Action":"pass","Package":"dbcloud/a","Elapsed":1}
`
	var out strings.Builder
	if failed, err := summarize(strings.NewReader(in), &out, 5); err != nil || failed {
		t.Fatalf("failed %v, err %v: a passing run must not fail", failed, err)
	}
}

// A test binary killed by -timeout ends without the test's own end: its
// output (the panic and the goroutines) is what explains the failure.
func TestSummarize_Unfinished(t *testing.T) {
	in := `{"Action":"run","Package":"dbcloud/e2e","Test":"TestHangs"}
{"Action":"output","Package":"dbcloud/e2e","Test":"TestHangs","Output":"panic: test timed out after 45m0s\n"}
{"Action":"output","Package":"dbcloud/e2e","Output":"FAIL\tdbcloud/e2e\t2700.1s\n"}
{"Action":"fail","Package":"dbcloud/e2e","Elapsed":2700.1}
`
	var out strings.Builder
	failed, err := summarize(strings.NewReader(in), &out, 5)
	if err != nil || !failed {
		t.Fatalf("failed %v, err %v", failed, err)
	}
	if got := out.String(); !strings.Contains(got, "dbcloud/e2e TestHangs, which never finished:\npanic: test timed out after 45m0s\n") {
		t.Errorf("the unfinished test's output is missing:\n%s", got)
	}
}
