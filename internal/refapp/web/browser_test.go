package web_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/logging"
	"github.com/rte-project/rte/internal/refapp/refapptest"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"

	"github.com/chromedp/chromedp"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
)

// chromiumPath is Debian's chromium, which scripts/deps installs.
const chromiumPath = "/usr/bin/chromium"

// browserTestTimeout bounds the whole browser test, a safety net: it takes well under a
// minute on a quiet machine.
const browserTestTimeout = 3 * time.Minute

// TestAdminPageInABrowser drives the admin page in headless Chromium against the real pieces:
// the app as `rte-app serve` runs it, and the real rte binary over TLS registering itself.
// It signs in, reviews the waiting runner and compares the fingerprints shown with those the
// RTE logged, approves, runs the example playbook from the page and watches it to its end,
// then starts a long one and cancels it from the page. Screenshots of the runners list, the
// review and the job pages go to RTE_SCREENSHOTS (default a temporary folder; the log names it).
func TestAdminPageInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the browser test runs a real RTE, real playbooks and Chromium")
	}
	_, chromiumErr := os.Stat(chromiumPath)
	_, ansibleErr := exec.LookPath("ansible-playbook")
	for _, need := range []struct {
		err       error
		what, pkg string
	}{
		{chromiumErr, chromiumPath, "chromium"},
		{ansibleErr, "ansible-playbook", "ansible-core"},
	} {
		if need.err == nil {
			continue
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing: CI must have it, and scripts/deps installs Debian's %s", need.what, need.pkg)
		}
		t.Skipf("%s is missing: install Debian's %s (apt-get install -y %s), or run scripts/deps, to run the admin page's browser test", need.what, need.pkg, need.pkg)
	}

	shots := os.Getenv("RTE_SCREENSHOTS")
	if shots == "" {
		shots = filepath.Join(t.TempDir(), "screenshots")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	shots, _ = filepath.Abs(shots)
	t.Logf("screenshots go to %s", shots)

	repo, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	binDir := t.TempDir()
	if err := testenv.Build(binDir, "../../..", false, "rte"); err != nil {
		t.Fatal(err)
	}
	rteBin := filepath.Join(binDir, "rte")
	appURL, a := startBrowserTestApp(t)

	// The real RTE, over TLS with a certificate it generates, registering with the app.
	const runnerName = "browser-rte"
	port := testenv.MustFreePort(t)
	rteDir := t.TempDir()
	home := filepath.Join(rteDir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	rteEnv := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"LANG=C.UTF-8",
		"RTE_TOKEN=" + settings.NewToken(),
		"RTE_NAME=" + runnerName,
		"HTTPS=1",
		"HTTPS_CERT=" + filepath.Join(rteDir, "certificates", "cert.pem"),
		"HTTPS_KEY=" + filepath.Join(rteDir, "certificates", "key.pem"),
		"LISTEN_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(port),
		"RTE_URL=https://127.0.0.1:" + strconv.Itoa(port),
		"APP_URL=" + appURL,
		// The repository's root, so the page names the files as they are in the tree:
		// examples/playbooks/site.yml and this package's testdata/sleep.yml.
		"RTE_FILES=local",
		"ANSIBLE_PATH=" + repo,
		"REPO_PATH=" + repo,
		"RTE_SPOOL_PATH=" + filepath.Join(rteDir, "spool"),
		"RTE_WORK_PATH=" + filepath.Join(rteDir, "jobs"),
		"RTE_CACHE_PATH=" + filepath.Join(rteDir, "cache"),
		"RTE_DRAIN_SECONDS=5",
		"LOG_FORMAT=json",
		"LOG_LEVEL=info",
	}
	rte := testenv.StartRTE(t, rteBin, rteDir, port, rteEnv...)
	// Registered after StartRTE's kill, so it runs first: the RTE must stop on SIGTERM.
	t.Cleanup(func() {
		if err := rte.Stop(30 * time.Second); err != nil {
			t.Errorf("stop the RTE: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), browserTestTimeout)
	defer cancel()
	logged := map[string]string{}
	for k, v := range rte.WaitLogMatch(0, "rte starting", 30*time.Second, func(l map[string]any) bool { return l["msg"] == "rte starting" }) {
		if s, ok := v.(string); ok {
			logged[k] = s
		}
	}
	for _, k := range []string{"token_fingerprint", "certificate_fingerprint", "certificate_sha256"} {
		if logged[k] == "" {
			t.Fatalf("the RTE's rte starting line has no %s: %v", k, logged)
		}
	}

	b := startBrowser(t, ctx, shots, appURL, rte)

	// Sign in: the runners page sends a stranger to the sign-in page first.
	b.do("open the runners page", chromedp.Navigate(appURL+"/runners"))
	if loc := b.location(); !strings.Contains(loc, "/signin?next=%2Frunners") {
		t.Fatalf("a stranger opening /runners is at %s, want the sign-in page", loc)
	}
	b.do("sign in",
		chromedp.SendKeys(chromedp.CSS("#token"), refapptest.AdminToken),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#runners")))

	// The RTE's registration shows as a notice above the list.
	b.reloadUntil("the notice that a runner waits for approval", appURL+"/runners",
		`!!document.querySelector('#waiting-notice') && document.querySelector('tr[data-runner="`+runnerName+`"] .badge').textContent === 'waiting'`)
	if notice := b.text("#waiting-notice"); !strings.Contains(notice, "1 runner waits for approval") {
		t.Errorf("the notice says %q, want it to say 1 runner waits for approval", notice)
	}
	b.screenshot("1-runners-waiting.png")

	// The review: the fingerprints shown must be what the RTE logged at start.
	b.do("open the review", chromedp.Click(chromedp.CSS(`tr[data-runner="`+runnerName+`"] a.review`)), chromedp.WaitVisible(chromedp.CSS("#review")))
	b.do("open the full SHA-256", chromedp.Click(chromedp.CSS("#cert details.sha summary")), chromedp.WaitVisible(chromedp.CSS("#cert details.sha code")))
	shown := map[string]string{
		"token_fingerprint":       b.text("#token-fp"),
		"certificate_fingerprint": b.text("#cert code.fp"),
		"certificate_sha256":      b.text("#cert details.sha code"),
	}
	for k, got := range shown {
		if got != logged[k] {
			t.Errorf("the review shows %s %q, the RTE logged %q: they must be the same", k, got, logged[k])
		}
	}
	if compare := b.text("#compare"); !strings.Contains(compare, "rte starting") {
		t.Errorf("the review's sentence %q does not say to compare with the rte starting line", compare)
	}
	if ip := b.text("#request-ip"); ip != "127.0.0.1" {
		t.Errorf("the review shows the request came from %q, want 127.0.0.1", ip)
	}
	b.screenshot("2-review-approval.png")

	b.do("approve", chromedp.Click(chromedp.CSS("#approve")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if flash := b.text("#flash"); !strings.Contains(flash, "trusts only certificate "+logged["certificate_fingerprint"]) {
		t.Errorf("after approving the page says %q, want it to name the pinned certificate %s", flash, logged["certificate_fingerprint"])
	}
	b.reloadUntil("the runner connected", appURL+"/runners",
		`(document.querySelector('tr[data-runner="`+runnerName+`"] .conn-state') || {}).textContent === 'connected'`)
	b.screenshot("3-runners-connected.png")

	// A job started from the page, followed to its end.
	b.startJob(appURL, runnerName, "examples/playbooks/site.yml", "examples/inventory/hosts.yml", `{"greeting": "hello from the browser test"}`)
	successID := b.jobID()
	b.waitUntil("the job ended success", endedPage("success"))
	out := b.text("#output")
	for _, want := range []string{"PLAY [Demo play]", "hello from the browser test", "PLAY RECAP"} {
		if !strings.Contains(out, want) {
			t.Errorf("the finished job's output lacks %q:\n%s", want, out)
		}
	}
	b.waitUntil("the Hosts and tasks view with every task and the recap",
		`!!document.querySelector('#summary tr.task[data-task="Write the greeting"] + tr.host .badge.r-changed') &&
		 !!document.querySelector('#summary tr.task[data-task="Remove the scratch directory"]') &&
		 !!document.querySelector('#recap tr[data-host="localhost"]') &&
		 document.querySelectorAll('#summary .timeline rect.bar').length >= 8`)
	b.screenshot("4-job-success.png")

	// A long job, followed live, then canceled from the page. The marker set on the page
	// proves the output and the summary arrived without a reload.
	b.startJob(appURL, runnerName, "internal/refapp/web/testdata/sleep.yml", "examples/inventory/hosts.yml", "")
	canceledID := b.jobID()
	b.do("mark the page", chromedp.Evaluate[chromedp.Void]("window.rteNotReloaded = true; undefined"))
	b.waitUntil("the running job's output and its Sleep task, live",
		`window.rteNotReloaded === true &&
		 document.querySelector('#job-state').textContent === 'running' &&
		 document.querySelector('#output').textContent.includes('TASK [Sleep]') &&
		 !!document.querySelector('#summary tr.task[data-task="Say it started"] + tr.host .badge.r-ok') &&
		 !!document.querySelector('#summary tr.task[data-task="Sleep"]')`)
	b.screenshot("5-job-running.png")
	b.do("cancel the job", chromedp.Click(chromedp.CSS("#cancel-job")))
	b.waitUntil("the job ended canceled", endedPage("canceled"))
	b.screenshot("6-job-canceled.png")

	for id, want := range map[string]string{successID: "success", canceledID: "canceled"} {
		j, err := a.GetJob(ctx, id)
		if err != nil || j.State != app.JobEnded || j.Status != want {
			t.Errorf("job %s in the store: %+v %v, want ended %s", id, j, err, want)
		}
	}
	b.do("open the jobs list", chromedp.Navigate(appURL+"/jobs"), chromedp.WaitVisible(chromedp.CSS("#job-list")))
	b.screenshot("7-jobs.png")
}

// endedPage is true on a job page drawn by the server after the job ended with status: the
// badge alone turns as the end record arrives, a moment before the page reloads.
func endedPage(status string) string {
	return `document.readyState === 'complete' &&
		(document.querySelector('#job') || {dataset: {}}).dataset.live === 'false' &&
		document.querySelector('#job-state').textContent === '` + status + `'`
}

// startBrowserTestApp runs the app as `rte-app serve` does, in this process, with quick
// dispatch so an approved runner is dialled at once.
func startBrowserTestApp(t *testing.T) (string, *app.App) {
	t.Helper()
	store, err := sqlitestore.Open(filepath.Join(t.TempDir(), "app.db"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &refapptest.SyncBuffer{}
	logger, err := logging.New("info", "json", logs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(app.Config{Store: store, Logger: logger, Node: "browser-test-app",
		PollInterval: 100 * time.Millisecond, RedialMin: 100 * time.Millisecond, RedialMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, a, ln, refapptest.AdminToken, logger) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serveApp returned %v, want nil after its context ended", err)
		}
		store.Close()
		if strings.Contains(logs.String(), refapptest.AdminToken) {
			t.Errorf("the admin token reached the app's log")
		}
		if t.Failed() {
			t.Logf("the app's log:\n%s", logs.String())
		}
	})
	return "http://" + ln.Addr().String(), a
}

// browser is one headless Chromium tab with the test's helpers. A failing step stops the
// test with the page's text, a screenshot and the RTE's last log lines.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string
	rte   *testenv.RTE
}

func startBrowser(t *testing.T, parent context.Context, shots, appURL string, rte *testenv.RTE) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1360, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(format string, args ...any) {
		t.Logf("chromedp: "+format, args...)
	}))
	// Cleanups run last-in first-out: the browser goes before the RTE and the app.
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", chromiumPath, err)
	}
	return &browser{t: t, ctx: ctx, shots: shots, rte: rte}
}

// do runs steps, or stops the test saying what it was doing.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fatal("%s: %v", what, err)
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%s) || {innerText: ''}).innerText`, strconv.Quote(sel))))
	if err != nil {
		b.fatal("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func (b *browser) location() string {
	b.t.Helper()
	loc, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		b.fatal("read the location: %v", err)
	}
	return loc
}

// jobID is the id of the job whose page is open.
func (b *browser) jobID() string {
	b.t.Helper()
	loc := b.location()
	i := strings.LastIndex(loc, "/jobs/")
	if i < 0 {
		b.fatal("not on a job page: %s", loc)
	}
	return loc[i+len("/jobs/"):]
}

// waitUntil evaluates cond on the open page until it is true. A page that reloads in the
// meantime (the job page does at a job's end) makes an evaluation fail; the next one runs on
// the new page.
func (b *browser) waitUntil(what, cond string) {
	b.t.Helper()
	var err error
	held := testenv.Poll(time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		defer cancel()
		var ok bool
		ok, err = chromedp.Run(ctx, chromedp.Evaluate[bool]("(() => { try { return !!("+cond+"); } catch (e) { return false; } })()"))
		return (err == nil && ok) || b.ctx.Err() != nil
	})
	if !held || b.ctx.Err() != nil {
		b.fatal("waited a minute for %s (last error %v)", what, err)
	}
}

// reloadUntil opens url again until cond holds on it: for pages that do not update
// themselves, such as the runners list.
func (b *browser) reloadUntil(what, url, cond string) {
	b.t.Helper()
	var err error
	held := testenv.Poll(time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		err = chromedp.Do(ctx, chromedp.Navigate(url))
		var ok bool
		if err == nil {
			ok, err = chromedp.Run(ctx, chromedp.Evaluate[bool]("(() => { try { return !!("+cond+"); } catch (e) { return false; } })()"))
		}
		if err == nil && ok {
			return true
		}
		select {
		case <-b.rte.Done():
			b.fatal("the RTE exited while waiting for %s: %v", what, b.rte.Err())
		default:
		}
		return b.ctx.Err() != nil
	})
	if !held || b.ctx.Err() != nil {
		b.fatal("waited a minute for %s (last error %v)", what, err)
	}
}

// startJob fills in the jobs page's form and starts the job; the job's page is open after.
func (b *browser) startJob(appURL, runner, playbook, inventory, extravars string) {
	b.t.Helper()
	b.do("open the jobs page", chromedp.Navigate(appURL+"/jobs"), chromedp.WaitVisible(chromedp.CSS("#start-form")))
	steps := []chromedp.Action[chromedp.Void]{
		chromedp.SetValue(chromedp.CSS("#runner"), runner),
		chromedp.SendKeys(chromedp.CSS("#playbook"), playbook),
		chromedp.SendKeys(chromedp.CSS("#inventories"), inventory),
	}
	if extravars != "" {
		steps = append(steps, chromedp.SendKeys(chromedp.CSS("#extravars"), extravars))
	}
	steps = append(steps, chromedp.Click(chromedp.CSS("#start-job")), chromedp.WaitVisible(chromedp.CSS("#job")))
	b.do("start "+playbook, steps...)
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Errorf("screenshot %s: %v", name, err)
		return
	}
	if err := os.WriteFile(filepath.Join(b.shots, name), png, 0o644); err != nil {
		b.t.Errorf("write %s: %v", name, err)
	}
}

// fatal stops the test with what the page showed, for a failure that explains itself.
func (b *browser) fatal(format string, args ...any) {
	b.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if b.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		body, err := chromedp.Run(ctx, chromedp.Evaluate[string]("document.location.href + '\\n' + document.body.innerText"))
		cancel()
		if err == nil {
			if len(body) > 4000 {
				body = body[:4000] + "..."
			}
			msg += "\n--- the page:\n" + body
		}
		b.screenshot("failure.png")
	} else if errors.Is(b.ctx.Err(), context.DeadlineExceeded) {
		msg += fmt.Sprintf("\n(the test's %s ran out)", browserTestTimeout)
	}
	b.t.Fatalf("%s\n--- the RTE's last log lines:\n%s", msg, testenv.Tail(b.rte.Log(), 20))
}
