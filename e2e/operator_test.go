package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// TestRTECommandsAnswerHelp runs every rte command with -h and --help (usage on stdout, exit 0,
// nothing served) and with an unknown flag or too many arguments (usage, exit 2).
func TestRTECommandsAnswerHelp(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	env := []string{"RTE_TOKEN=" + testToken, fmt.Sprintf("PORT=%d", port), "LISTEN_HOST=127.0.0.1"}
	for _, cmd := range []string{"serve", "check-config", "fingerprint", "version", "help"} {
		for _, h := range []string{"-h", "--help"} {
			out, code := runRTE(t, dir, env, cmd, h)
			if code != 0 || !strings.HasPrefix(out, "usage: rte "+cmd) {
				t.Errorf("rte %s %s: exit %d, want 0 with its usage:\n%s", cmd, h, code, out)
			}
		}
		// A refused flag wins over --help: the command line is wrong either way.
		out, code := runRTE(t, dir, env, cmd, "--help", "--bogus")
		if code != 2 || !strings.Contains(out, "usage: rte "+cmd) {
			t.Errorf("rte %s --help --bogus: exit %d, want 2 with its usage:\n%s", cmd, code, out)
		}
		out, code = runRTE(t, dir, env, cmd, "--bogus")
		if code != 2 || !strings.Contains(out, "flag provided but not defined: -bogus") || !strings.Contains(out, "usage: rte "+cmd) {
			t.Errorf("rte %s --bogus: exit %d, want 2 with the usage:\n%s", cmd, code, out)
		}
		out, code = runRTE(t, dir, env, cmd, "a", "b")
		if code != 2 || !strings.Contains(out, "usage: rte "+cmd) {
			t.Errorf("rte %s a b: exit %d, want 2 with the usage:\n%s", cmd, code, out)
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		if out, code := runRTE(t, dir, env, args...); code != 0 || !strings.Contains(out, "check-config") {
			t.Errorf("rte %s: exit %d, want 0 with the list of commands:\n%s", args, code, out)
		}
	}
	if out, code := runRTE(t, dir, env, "bogus"); code != 2 || !strings.Contains(out, `unknown command "bogus"`) {
		t.Errorf("rte bogus: exit %d, want 2:\n%s", code, out)
	}
	// None of them served: the port is still free.
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Fatal("something listens on the port after help and refused command lines")
	}
}

// TestVersionNamesTheCommit compares `rte version` with what `go version -m` reads from the
// same binary: the commit Go recorded (vcs.revision) and whether the tree had changes.
func TestVersionNamesTheCommit(t *testing.T) {
	bin := filepath.Join(binDir, "rte")
	meta, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m: %v", err)
	}
	settings := map[string]string{}
	for _, line := range strings.Split(string(meta), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "build" {
			if k, v, ok := strings.Cut(f[1], "="); ok {
				settings[k] = v
			}
		}
	}
	out, code := runRTE(t, t.TempDir(), nil, "version")
	if code != 0 {
		t.Fatalf("rte version: exit %d: %s", code, out)
	}
	rev := settings["vcs.revision"]
	if rev == "" {
		// Built without VCS stamping (-buildvcs=false, no git, or a git worktree Go does not
		// read): the version says it is a development build and claims no commit.
		if !regexp.MustCompile(`^rte 0\.0\.0-dev \(protocol \d+\)\n$`).MatchString(out) {
			t.Errorf("rte version without build VCS info = %q, want rte 0.0.0-dev (protocol N)", out)
		}
		t.Logf("the test binary carries no vcs.revision (%s): only the development form was checked", out)
		return
	}
	if !strings.Contains(out, rev[:12]) {
		t.Errorf("rte version = %q, want it to name commit %s", out, rev[:12])
	}
	dirty := strings.Contains(out, "dirty") || strings.Contains(out, "modified")
	if want := settings["vcs.modified"] == "true"; dirty != want {
		t.Errorf("rte version = %q; vcs.modified is %q", out, settings["vcs.modified"])
	}
}

// TestCheckConfigReportsWhatServeRefuses gives check-config and serve the same settings for
// every failure serve has at start with files and folders: check-config must report it (exit
// 2, naming the variable), and serve must refuse it the same way before it listens.
func TestCheckConfigReportsWhatServeRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certA, keyA := writePair(t, dir, "a")
	_, keyB := writePair(t, dir, "b")
	aFile := write("a-file", "not a folder\n")
	noPEM := write("no-pem.crt", "no certificate here\n")

	outbound := []string{"RTE_MODE=outbound", "APP_URL=https://app.example:8443"}
	cases := []struct {
		name string
		env  []string
		says []string
	}{
		{"missing CA bundle", append(outbound, "NODE_EXTRA_CA_CERTS="+filepath.Join(dir, "nope.pem")),
			[]string{"NODE_EXTRA_CA_CERTS", "nope.pem"}},
		{"CA bundle without a certificate", append(outbound, "NODE_EXTRA_CA_CERTS="+noPEM),
			[]string{"NODE_EXTRA_CA_CERTS", "holds no PEM certificate"}},
		{"certificate without its key", []string{"HTTPS=1", "HTTPS_CERT=" + certA, "HTTPS_KEY=" + filepath.Join(dir, "gone.key")},
			[]string{"HTTPS_CERT", "exists but its key"}},
		{"key without its certificate", []string{"HTTPS=1", "HTTPS_CERT=" + filepath.Join(dir, "gone.crt"), "HTTPS_KEY=" + keyA},
			[]string{"HTTPS_CERT", "exists but its certificate"}},
		{"certificate that does not parse", []string{"HTTPS=1", "HTTPS_CERT=" + noPEM, "HTTPS_KEY=" + keyA},
			[]string{"HTTPS_CERT", "no-pem.crt"}},
		{"key of another certificate", []string{"HTTPS=1", "HTTPS_CERT=" + certA, "HTTPS_KEY=" + keyB},
			[]string{"HTTPS_CERT", "does not match certificate"}},
		{"certificate folder not writable", []string{"HTTPS=1", "HTTPS_CERT=" + filepath.Join(aFile, "c.crt"), "HTTPS_KEY=" + filepath.Join(aFile, "c.key")},
			[]string{"HTTPS_CERT", "not a directory"}},
		{"local files missing", []string{"RTE_FILES=local", "ANSIBLE_PATH=" + filepath.Join(dir, "no-playbooks"), "REPO_PATH=" + aFile},
			[]string{"ANSIBLE_PATH", "no-playbooks", "REPO_PATH", "is not a folder"}},
		{"spool not writable", []string{"RTE_SPOOL_PATH=" + filepath.Join(aFile, "spool")},
			[]string{"RTE_SPOOL_PATH", "is not a folder"}},
		// /proc takes no new file, not even from root.
		{"work folder not writable", []string{"RTE_WORK_PATH=/proc/rte-work"},
			[]string{"RTE_WORK_PATH", "cannot be written"}},
		{"cache not writable", []string{"RTE_CACHE_PATH=/proc/rte-cache"},
			[]string{"RTE_CACHE_PATH", "cannot be written"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			work := t.TempDir()
			port := freePort(t)
			env := append([]string{"RTE_TOKEN=" + testToken, fmt.Sprintf("PORT=%d", port), "LISTEN_HOST=127.0.0.1"}, tc.env...)
			out, code := runRTE(t, work, env, "check-config")
			if code != 2 || strings.Contains(out, "settings: ok") {
				t.Fatalf("check-config: exit %d, want 2 with the problem:\n%s", code, out)
			}
			out, code = runRTE(t, work, env, "serve")
			if code != 2 {
				t.Fatalf("serve: exit %d, want 2 (refused before listening):\n%s", code, out)
			}
			problems := out[strings.Index(out, "problem(s)"):]
			for _, want := range tc.says {
				if !strings.Contains(problems, want) {
					t.Errorf("serve's refusal lacks %q:\n%s", want, out)
				}
			}
			if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
				c.Close()
				t.Fatal("serve listened although it refused its settings")
			}
		})
	}

	// A value that does not parse is shown as written, and a refused value gets no warning.
	out, code := runRTE(t, dir, []string{"RTE_TOKEN=" + testToken, "RTE_MAX_JOBS=abc", "APP_TLS_VERIFY=no"}, "check-config")
	if code != 2 || !regexp.MustCompile(`RTE_MAX_JOBS\s+"abc" \(refused`).MatchString(out) || strings.Contains(out, "not verified") {
		t.Errorf("check-config with RTE_MAX_JOBS=abc APP_TLS_VERIFY=no: exit %d, want 2, \"abc\" shown and no warning about verification:\n%s", code, out)
	}
}

// writePair makes a certificate and key with the RTE's own code, in their own folder.
func writePair(t *testing.T, dir, name string) (certPath, keyPath string) {
	t.Helper()
	certPath, keyPath = filepath.Join(dir, name, "cert.pem"), filepath.Join(dir, name, "key.pem")
	if _, err := pinning.LoadOrCreate(certPath, keyPath, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath
}

// TestSIGHUPKeepsJobsRunning sends SIGHUP twice while a job runs: the RTE logs that it ignores
// it, keeps serving and ready, and the job ends success; only SIGTERM then stops it. The job
// metrics follow the job.
func TestSIGHUPKeepsJobsRunning(t *testing.T) {
	r := newJobRig(t, withRTEEnv("METRICS_TOKEN=metrics-token-0123456789"))
	metric := func(series string) string {
		t.Helper()
		_, body := r.RTE.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				return v
			}
		}
		return "absent"
	}
	j := r.submit(protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"seconds":"6"}`)})
	r.waitState(j.ID, app.JobRunning, time.Minute)
	waitPresent(t, "sleep 6")
	mark, logStart := r.RTE.Mark(), len(r.RTE.Log())
	r.RTE.Signal(syscall.SIGHUP)
	r.RTE.WaitLogAfter(mark, "SIGHUP ignored: settings are read once, at start; restart the RTE to change them (SIGTERM drains)", 10*time.Second)
	// A second one is no "second signal": nothing stops.
	r.RTE.Signal(syscall.SIGHUP)
	if code, body := r.RTE.Probe("/ready"); code != 200 {
		t.Fatalf("/ready after SIGHUP = %d %s, want 200", code, body)
	}
	if v := metric("rte_jobs_running"); v != "1" {
		t.Errorf("rte_jobs_running while the job sleeps = %s, want 1", v)
	}
	end := r.waitEnd(j.ID, 2*time.Minute)
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("job after SIGHUP: %+v, want success", end)
	}
	// The end reaches the app as the runner lets go of the job: wait for that.
	testenv.Poll(10*time.Second, func() bool { return metric("rte_jobs_running") == "0" })
	for series, want := range map[string]string{
		"rte_jobs_running": "0", `rte_jobs_ended_total{status="success"}`: "1",
		`rte_job_duration_seconds_count{status="success"}`: "1", `rte_jobs_ended_total{status="abandoned"}`: "0",
	} {
		if got := metric(series); got != want {
			t.Errorf("%s after the job = %s, want %s", series, got, want)
		}
	}
	if strings.Contains(r.RTE.Log()[logStart:], `"stopping"`) {
		t.Fatalf("SIGHUP started a drain:\n%s", r.RTE.Log()[logStart:])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil && strings.Count(r.RTE.Log()[logStart:], "SIGHUP ignored") < 2 {
		time.Sleep(20 * time.Millisecond)
	}
	if n := strings.Count(r.RTE.Log()[logStart:], "SIGHUP ignored"); n != 2 {
		t.Errorf("%d SIGHUP log lines, want 2", n)
	}
	r.RTE.Signal(syscall.SIGTERM)
	if code := r.RTE.Wait(time.Minute); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0", code)
	}
}

// TestMetricsNamesAndZeroSeries scrapes /metrics of a fresh real RTE (inbound, transfer mode,
// HTTPS): every rte_ family on the page is one docs/probes-and-metrics.md lists and the other
// way round, every counter series is there at 0 before anything happened, and the gauges say
// what a fresh RTE is.
func TestMetricsNamesAndZeroSeries(t *testing.T) {
	rte := startRTE(t, t.TempDir(), freePort(t), "RTE_TOKEN="+testToken, "METRICS_TOKEN=metrics-token-0123456789", "HTTPS=1")
	code, body := rte.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
	if code != 200 {
		t.Fatalf("/metrics = %d", code)
	}
	series := map[string]float64{}  // "name{labels}" as the page writes it -> value
	families := map[string]string{} // name -> type
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && strings.HasPrefix(f[2], "rte_") {
			families[f[2]] = f[3]
			continue
		}
		if !strings.HasPrefix(line, "rte_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		series[line[:i]] = v
	}

	if len(families) < 20 || len(series) < 50 {
		t.Fatalf("read %d rte_ families and %d series from /metrics; the page:\n%s", len(families), len(series), body)
	}

	docs, err := os.ReadFile("../docs/probes-and-metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(rte_[a-z_]+)` \\|").FindAllStringSubmatch(string(docs), -1) {
		documented[m[1]] = true
	}
	for name := range families {
		if !documented[name] {
			t.Errorf("%s is on /metrics but not in docs/probes-and-metrics.md", name)
		}
		if families[name] == "counter" && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
	for name := range documented {
		// Absent here by design: the registration runs only with APP_URL.
		if _, ok := families[name]; !ok && name != "rte_registration_state" {
			t.Errorf("%s is documented but not on the /metrics of an inbound transfer-mode HTTPS RTE", name)
		}
	}

	zero := []string{
		`rte_socket_replaced_total`, `rte_records_sent_total`, `rte_acks_total`, `rte_bundle_received_bytes_total`,
		`rte_socket_connections_total{direction="inbound"}`, `rte_socket_connections_total{direction="outbound"}`,
		`rte_bundles_received_total{result="ok"}`, `rte_bundles_received_total{result="discarded"}`, `rte_bundles_received_total{result="missing"}`,
		`rte_cache_hits_total`, `rte_cache_misses_total`, `rte_cache_evictions_total`, `rte_cache_bytes`, `rte_cache_bundles`,
		`rte_jobs_running`, `rte_spool_records_waiting`, `rte_spool_waiting_bytes`, `rte_spool_oldest_waiting_age_seconds`,
		`rte_socket_state{state="open"}`, `rte_socket_state{state="welcomed"}`, `rte_socket_connected`,
	}
	for _, code := range []string{"bad_json", "unknown_type", "missing_field", "bad_field", "invalid", "too_large", "unexpected"} {
		zero = append(zero, `rte_bad_messages_total{code="`+code+`"}`)
	}
	for _, e := range []string{"socket", "metrics"} {
		for _, r := range []string{"missing", "wrong"} {
			zero = append(zero, `rte_auth_failures_total{endpoint="`+e+`",reason="`+r+`"}`)
		}
	}
	for _, st := range []string{"success", "failed", "canceled", "timeout", "abandoned", "error"} {
		zero = append(zero, `rte_jobs_ended_total{status="`+st+`"}`, `rte_job_duration_seconds_count{status="`+st+`"}`)
	}
	for _, s := range zero {
		if v, ok := series[s]; !ok || v != 0 {
			t.Errorf("%s: present %v, value %v; want present at 0 on a fresh RTE", s, ok, v)
		}
	}
	if v := series[`rte_socket_state{state="none"}`]; v != 1 {
		t.Errorf(`rte_socket_state{state="none"} = %v, want 1 with no app`, v)
	}
	if v := series[`rte_spool_filesystem_free_bytes`]; v <= 0 {
		t.Errorf("rte_spool_filesystem_free_bytes = %v, want the free space of the spool's filesystem", v)
	}
	exp := series[`rte_listener_certificate_expiry_timestamp_seconds`]
	if now := float64(time.Now().Unix()); exp < now+86400 {
		t.Errorf("rte_listener_certificate_expiry_timestamp_seconds = %v, want the new certificate's end, well after now (%v)", exp, now)
	}
}
