package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// axe-core, the accessibility checker, comes at a pinned version through
// scripts/axe.sh (which scripts/deps.sh also runs); it is read once per
// test binary.
var axeSource struct {
	once sync.Once
	js   string
	err  error
}

func axeJS(t *testing.T) string {
	t.Helper()
	axeSource.once.Do(func() {
		out, err := exec.Command("../scripts/axe.sh").Output()
		if err != nil {
			axeSource.err = fmt.Errorf("scripts/axe.sh: %w", err)
			return
		}
		raw, err := os.ReadFile(strings.TrimSpace(string(out)))
		axeSource.js, axeSource.err = string(raw), err
	})
	if axeSource.err != nil {
		t.Fatal(axeSource.err)
	}
	return axeSource.js
}

// axeViolation is what a failure names of an axe-core violation.
type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target  []any  `json:"target"`
		Summary string `json:"failureSummary"`
	} `json:"nodes"`
}

// axeCheck runs axe-core in the current page and fails the test for each
// violation of impact serious or critical, naming its rule, its help and
// the elements. The checker is evaluated through the DevTools protocol,
// which the page's CSP does not govern, so the CSP stays as users get it.
func axeCheck(t *testing.T, ctx context.Context, page string) {
	t.Helper()
	var raw string
	run(t, ctx, 60*time.Second, "axe-core on "+page,
		chromedp.Evaluate("if (!window.axe) {\n"+axeJS(t)+"\n}", nil),
		chromedp.Evaluate(`axe.run(document, {resultTypes: ["violations"]}).then(r => JSON.stringify(r.violations.filter(v => v.impact === "serious" || v.impact === "critical")))`,
			&raw, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
	)
	var vs []axeViolation
	if err := json.Unmarshal([]byte(raw), &vs); err != nil {
		t.Fatalf("axe-core on %s: %v: %s", page, err, raw)
	}
	for _, v := range vs {
		var nodes []string
		for _, n := range v.Nodes {
			nodes = append(nodes, fmt.Sprintf("    %v: %s", n.Target, strings.ReplaceAll(n.Summary, "\n", " ")))
		}
		t.Errorf("%s: %s (%s): %s\n%s", page, v.ID, v.Impact, v.Help, strings.Join(nodes, "\n"))
	}
}

// screenWidths are the widths the console is laid out for: a phone, a
// tablet, a laptop and a desktop.
var screenWidths = []int64{390, 768, 1280, 1440}

// screenHeight is a window height that goes with width w: a phone's and
// a tablet's are portrait.
func screenHeight(w int64) int64 {
	switch {
	case w < 600:
		return 844
	case w < 1000:
		return 1024
	}
	return 900
}

// consolePage is a page of the console the accessibility and layout pass
// visits: shot names its screenshots, when it has them.
type consolePage struct {
	name, url, wait, shot string
}

// testPagesAccessible opens each page and checks it at every width
// (pageAtWidths).
func testPagesAccessible(t *testing.T, ctx context.Context, shot func(string), pages []consolePage) {
	t.Helper()
	for _, p := range pages {
		run(t, ctx, 30*time.Second, "open "+p.name,
			chromedp.EmulateViewport(1280, 900),
			chromedp.Navigate(p.url),
			chromedp.WaitVisible(p.wait, chromedp.ByQuery),
		)
		pageAtWidths(t, ctx, shot, p)
	}
}

// pageAtWidths checks the page the browser shows at each screen width:
// it scrolls no wider than the window (tables scroll in their boxes), the
// header is one row at laptop widths, and axe-core finds nothing serious
// or critical. With DBCLOUD_SCREENSHOTS set (make screenshots) a page with
// a shot name is also captured at each width, as NAME-WIDTH.png. It
// leaves the window at 1280 px.
func pageAtWidths(t *testing.T, ctx context.Context, shot func(string), p consolePage) {
	t.Helper()
	defer run(t, ctx, 10*time.Second, "back to 1280 px", chromedp.EmulateViewport(1280, 900))
	shots := os.Getenv("DBCLOUD_SCREENSHOTS") != ""
	for _, w := range screenWidths {
		var wide int64
		run(t, ctx, 30*time.Second, fmt.Sprintf("%s at %d px", p.name, w),
			chromedp.EmulateViewport(w, screenHeight(w)),
			chromedp.WaitVisible(p.wait, chromedp.ByQuery),
			chromedp.Evaluate(`document.documentElement.scrollWidth`, &wide),
		)
		if wide > w {
			t.Errorf("%s at %d px is %d px wide", p.name, w, wide)
		}
		if w >= 1280 {
			var oneRow bool
			run(t, ctx, 30*time.Second, fmt.Sprintf("the header of %s at %d px", p.name, w),
				chromedp.Evaluate(`(() => { const h = document.querySelector("header.top"); if (!h) return true;
					const r = [...h.children].filter(c => c.offsetParent !== null).map(c => c.getBoundingClientRect());
					return Math.max(...r.map(x => x.top)) < Math.min(...r.map(x => x.bottom)); })()`, &oneRow),
			)
			if !oneRow {
				t.Errorf("%s: the header wraps at %d px", p.name, w)
			}
		}
		// What is reachable by keyboard depends on what scrolls, so the
		// checker runs at each width.
		axeCheck(t, ctx, fmt.Sprintf("%s at %d px", p.name, w))
		if shots && p.shot != "" {
			shot(fmt.Sprintf("%s-%d", p.shot, w))
		}
	}
}
