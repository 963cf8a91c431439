package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// e2eSSHD is the shared real OpenSSH server on 127.0.0.1 (testenv.SSHD), which lets in every
// user holding its client key; it skips the test when sshd cannot run here.
type e2eSSHD struct{ *testenv.SSHD }

func startE2ESSHD(t *testing.T) *e2eSSHD {
	t.Helper()
	return &e2eSSHD{testenv.StartSSHDForTest(t, testenv.SSHDConfig{})}
}

func (s *e2eSSHD) target(name, user string) protocol.CheckTarget {
	return protocol.CheckTarget{Name: name, Host: "127.0.0.1", Port: s.Port, User: user, Transport: protocol.TransportSSH}
}

// giveKey puts the sshd's client key into home/.ssh as id_ed25519, as an operator would for
// the user the RTE runs as, and known_hosts with lines (none: no known_hosts file).
func (s *e2eSSHD) giveKey(t *testing.T, home string, knownHosts ...string) {
	t.Helper()
	if err := s.GiveKey(home, knownHosts...); err != nil {
		t.Fatal(err)
	}
}

// closedPorts returns n loopback ports nothing listens on now.
func closedPorts(t *testing.T, n int) []int {
	t.Helper()
	var lns []net.Listener
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// silentPort is a listener that never accepts: the kernel completes the TCP handshake and
// then nothing answers, as a hung daemon behind an open firewall.
func silentPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

type procLog = testenv.Buffer

func wantCheckStatus(t *testing.T, o protocol.CheckOutcome, status string, says ...string) {
	t.Helper()
	if o.Status != status {
		t.Errorf("target %s: %s (%q), want %s", o.Name, o.Status, o.Message, status)
	}
	for _, s := range says {
		if !strings.Contains(o.Message, s) {
			t.Errorf("target %s: message %q does not say %q", o.Name, o.Message, s)
		}
	}
}

// TestCheckEndToEnd is the connection check as the app asks it: the real app half over a real
// inbound socket to the real RTE, which logs in to a real sshd with the key and known_hosts in
// its own home directory. The host key is unknown first; the operator adds it, and the next
// check connects, without a restart.
func TestCheckEndToEnd(t *testing.T) {
	sshd := startE2ESSHD(t)
	r := newJobRig(t)
	ctx := context.Background()
	closed := closedPorts(t, 4)
	sshd.giveKey(t, r.dir) // no known_hosts yet

	targets := []protocol.CheckTarget{
		sshd.target("sshd", "root"),
		{Name: "closed", Host: "127.0.0.1", Port: closed[0], User: "root", Transport: protocol.TransportSSH},
	}
	res, err := r.App.Check(ctx, r.Name, targets, 5*time.Second)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if len(res.Results) != 2 {
		t.Fatalf("%d outcomes for 2 targets: %+v", len(res.Results), res.Results)
	}
	wantCheckStatus(t, res.Results[0], protocol.CheckHostKeyUnknown, ssh.FingerprintSHA256(sshd.HostKeys[ssh.KeyAlgoED25519]), "ssh-keyscan")
	wantCheckStatus(t, res.Results[1], protocol.CheckUnreachable, "refused")

	// The operator verifies the fingerprint and adds the key; the next check logs in.
	sshd.giveKey(t, r.dir, sshd.KnownHostsLine(""))
	targets = append(targets, sshd.target("nobody", "no-such-user"))
	res, err = r.App.Check(ctx, r.Name, targets, 5*time.Second)
	if err != nil {
		t.Fatalf("check after adding the host key: %v", err)
	}
	wantCheckStatus(t, res.Results[0], protocol.CheckConnected)
	wantCheckStatus(t, res.Results[1], protocol.CheckUnreachable)
	wantCheckStatus(t, res.Results[2], protocol.CheckAuthFailed, "no-such-user")
	for _, o := range res.Results {
		if o.Host != "127.0.0.1" || o.LatencyMS < 0 {
			t.Errorf("outcome %+v, want host 127.0.0.1 and a latency", o)
		}
	}

	// A batch of 200, mostly closed ports and two hosts that never answer: every target gets
	// its outcome in one check.result, within about one timeout (the limit is a safety net).
	var batch []protocol.CheckTarget
	silent := []int{silentPort(t), silentPort(t)}
	for i := range 200 {
		tg := protocol.CheckTarget{Name: fmt.Sprintf("t%03d", i), Host: "127.0.0.1", Port: closed[i%len(closed)], User: "root", Transport: protocol.TransportSSH}
		switch i {
		case 0, 100:
			tg = sshd.target(fmt.Sprintf("t%03d", i), "root")
		case 50, 150:
			tg.Port = silent[i/100]
		}
		batch = append(batch, tg)
	}
	const batchTimeout = 3 * time.Second
	bctx, cancel := context.WithTimeout(ctx, 4*batchTimeout)
	defer cancel()
	res, err = r.App.Check(bctx, r.Name, batch, batchTimeout)
	if err != nil {
		t.Fatalf("check of 200 targets: %v", err)
	}
	if len(res.Results) != len(batch) {
		t.Fatalf("%d outcomes for %d targets", len(res.Results), len(batch))
	}
	counts := map[string]int{}
	for i, o := range res.Results {
		counts[o.Status]++
		if o.Name != batch[i].Name {
			t.Fatalf("outcome %d is for %s, want %s: outcomes must keep the targets' order", i, o.Name, batch[i].Name)
		}
	}
	want := map[string]int{protocol.CheckConnected: 2, protocol.CheckTimeout: 2, protocol.CheckUnreachable: 196}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("statuses of the batch: %v, want %v", counts, want)
	}
	wantCheckStatus(t, res.Results[50], protocol.CheckTimeout)

	// Checks are not jobs: the RTE's capacity is untouched, and the socket still works.
	if st, ok := r.App.Status(r.Name); !ok || st.Capacity.Running != 0 {
		t.Fatalf("runner status %+v after the checks, want connected with no job running", st)
	}
	noRace(t, r.RTE)
}

// refApp is `rte-app serve`, the reference app's binary, on a port of its own.
type refApp struct {
	url   string
	token string
	log   procLog
}

func startRefApp(t *testing.T, env ...string) *refApp {
	t.Helper()
	a := &refApp{url: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), token: "e2e-admin-token-0123456789abcdef"}
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(binDir, "rte-app"), "serve")
	cmd.Dir = dir
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "APP_LISTEN=" + strings.TrimPrefix(a.url, "http://"),
		"APP_DB=" + filepath.Join(dir, "app.db"), "APP_ADMIN_TOKEN=" + a.token, "LOG_LEVEL=debug",
	}, env...)
	cmd.Stdout, cmd.Stderr = &a.log, &a.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("rte-app log:\n%s", a.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if status, _ := a.call(t, http.MethodGet, "/api/v2/runners", ""); status == http.StatusOK {
			return a
		}
		select {
		case <-exited:
			t.Fatalf("rte-app serve exited before it answered:\n%s", a.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rte-app serve did not answer within 30s:\n%s", a.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *refApp) call(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// cli runs `rte-app` with args against the app and returns its exit status and output.
func (a *refApp) cli(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "rte-app"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "APP_URL=" + a.url, "APP_ADMIN_TOKEN=" + a.token}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatalf("rte-app %v: %v", args, err)
	}
	return 0, string(out)
}

// TestCheckThroughReferenceApp asks through the reference app's admin API and its CLI, as an
// operator would: the real rte-app binary, a real outbound RTE joined with the join token, and
// a real sshd.
func TestCheckThroughReferenceApp(t *testing.T) {
	sshd := startE2ESSHD(t)
	ref := startRefApp(t, "RTE_JOIN_TOKEN="+joinToken)
	dir := t.TempDir()
	sshd.giveKey(t, dir, sshd.KnownHostsLine(""))
	rte := startRTE(t, dir, freePort(t), outboundEnv(ref.url, "rte-check", "RTE_JOIN_TOKEN="+joinToken)...)
	waitReady(t, rte)
	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))

	closed := closedPorts(t, 1)[0]
	body := fmt.Sprintf(`{"targets":[{"name":"web01","host":"127.0.0.1","port":%d,"user":"root"},`+
		`{"name":"web02","host":"127.0.0.1","port":%d,"user":"root"}],"timeout_ms":5000}`, sshd.Port, closed)
	status, answer := ref.call(t, http.MethodPost, "/api/v2/runners/rte-check/check_node_connections", body)
	if status != http.StatusOK {
		t.Fatalf("POST check_node_connections: %d %s, want 200", status, answer)
	}
	var res struct {
		Status string                  `json:"status"`
		Result []protocol.CheckOutcome `json:"result"`
	}
	if err := json.Unmarshal(answer, &res); err != nil {
		t.Fatalf("answer %s: %v", answer, err)
	}
	if res.Status != "failure" || len(res.Result) != 2 || res.Result[0].Name != "web01" || res.Result[1].Host != "127.0.0.1" {
		t.Fatalf("answer %s, want status failure with web01 and web02", answer)
	}
	wantCheckStatus(t, res.Result[0], protocol.CheckConnected)
	wantCheckStatus(t, res.Result[1], protocol.CheckUnreachable)

	status, answer = ref.call(t, http.MethodPost, "/api/v2/runners/rte-check/check_node_connections", `{"targets":[{"host":"127.0.0.1","port":"22"}]}`)
	if status != http.StatusBadRequest || !strings.Contains(string(answer), "targets[0].port") {
		t.Fatalf("a port written as a string: %d %s, want 400 naming targets[0].port", status, answer)
	}

	code, out := ref.cli(t, "check", "--runner", "rte-check", "--target", fmt.Sprintf("ssh://root@127.0.0.1:%d", sshd.Port))
	if code != 0 || !strings.Contains(out, "success: 1 of 1 targets connected") {
		t.Fatalf("rte-app check of the sshd: exit %d, want 0:\n%s", code, out)
	}
	code, out = ref.cli(t, "check", "--runner", "rte-check", "--timeout", "3s",
		"--target", fmt.Sprintf("ssh://root@127.0.0.1:%d", sshd.Port), "--target", fmt.Sprintf("root@127.0.0.1:%d", closed))
	if code != 4 || !strings.Contains(out, "failure: 1 of 2 targets connected") || !strings.Contains(out, "unreachable") {
		t.Fatalf("rte-app check with a closed port: exit %d, want 4:\n%s", code, out)
	}
	t.Logf("rte-app check:\n%s", out)
	noRace(t, rte)
}
