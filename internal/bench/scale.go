package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// ScaleResult is the scale section.
type ScaleResult struct {
	Jobs       int
	RTEIdleRSS int64 // the RTE's RSS before the jobs
	RTEJobsRSS int64 // with every job running
	Sockets    int
	AppIdleRSS int64 // an app node with no runners
	AppSockRSS int64 // an app node holding Sockets connected runners
	Connected  int   // the runners the app reported connected when measured
}

// settle is how long a process is left alone before its RSS is read, so the garbage collector
// has run after the start-up and the burst of connections.
var settle = 5 * time.Second

// Scale measures one RTE running jobs stand-in jobs at once, and one app node holding sockets
// idle sockets to fake RTEs served by a separate process (self, with RTE_BENCH_FAKE_RTES set).
func Scale(ctx context.Context, bin Binaries, work, self string, jobs, sockets int, progress io.Writer) (ScaleResult, error) {
	res := ScaleResult{Jobs: jobs, Sockets: sockets}
	if err := raiseFileLimit(uint64(2*sockets + 1024)); err != nil {
		return res, err
	}
	if err := scaleJobs(ctx, bin, work, &res); err != nil {
		return res, err
	}
	fmt.Fprintf(progress, "  %d jobs: RTE RSS %s idle, %s with all running\n", jobs, mb(res.RTEIdleRSS), mb(res.RTEJobsRSS))
	if err := scaleSockets(ctx, bin, work, self, &res); err != nil {
		return res, err
	}
	fmt.Fprintf(progress, "  %d sockets: app RSS %s with none, %s with %d connected\n", sockets, mb(res.AppIdleRSS), mb(res.AppSockRSS), res.Connected)
	return res, nil
}

// raiseFileLimit raises this process's open-file limit to at least want (up to the hard
// limit); children inherit it. The app node holds a descriptor per socket and the fake RTEs'
// process two per socket.
func raiseFileLimit(want uint64) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return err
	}
	if rl.Cur >= want {
		return nil
	}
	if rl.Max < want {
		return fmt.Errorf("the open-file limit's hard maximum is %d and the scale section needs %d: raise it (ulimit -Hn) or pass a smaller -sockets", rl.Max, want)
	}
	rl.Cur = want
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
}

func scaleJobs(ctx context.Context, bin Binaries, work string, res *ScaleResult) error {
	r, err := standInRig(ctx, bin, filepath.Join(work, "scale-jobs"), "RTE_MAX_JOBS="+strconv.Itoa(res.Jobs))
	if err != nil {
		return err
	}
	defer r.Stop()
	time.Sleep(settle)
	if res.RTEIdleRSS, err = RSS(r.RTE.Pid()); err != nil {
		return err
	}
	// Long enough to outlast the measurement; the rig's stop ends them.
	for i := 0; i < res.Jobs; i++ {
		if _, err := r.Submit(ctx, api.JobOptions{Playbook: "standin.yml", Inventories: []string{"local.ini"},
			Env: map[string]string{"BENCH_SLEEP": "600"}}); err != nil {
			return err
		}
	}
	var running int
	if !testenv.Poll(5*time.Minute, func() bool {
		runners, err := r.Client.Runners(ctx)
		if err == nil && len(runners) == 1 && runners[0].Capacity != nil {
			running = runners[0].Capacity.Running
		}
		return running == res.Jobs
	}) {
		return fmt.Errorf("the RTE reported %d of %d jobs running after 5 minutes", running, res.Jobs)
	}
	time.Sleep(settle)
	res.RTEJobsRSS, err = RSS(r.RTE.Pid())
	return err
}

func scaleSockets(ctx context.Context, bin Binaries, work, self string, res *ScaleResult) error {
	dir := filepath.Join(work, "scale-sockets")
	// An app node with no runners, for the baseline.
	a, _, err := startApp(ctx, bin.App, filepath.Join(dir, "idle"), "")
	if err != nil {
		return err
	}
	time.Sleep(settle)
	res.AppIdleRSS, err = RSS(a.Pid())
	a.Stop()
	if err != nil {
		return err
	}
	seed := filepath.Join(dir, "seed.yml")
	fakes := exec.CommandContext(ctx, self)
	fakes.Env = append(os.Environ(), envFakes+"="+strconv.Itoa(res.Sockets), envFakesSeed+"="+seed)
	fakes.SysProcAttr = testenv.OwnGroupTiedToParent()
	fakes.Stderr = os.Stderr
	stdin, err := fakes.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := fakes.StdoutPipe()
	if err != nil {
		return err
	}
	if err := fakes.Start(); err != nil {
		return fmt.Errorf("start the fake RTEs (%s): %w", self, err)
	}
	defer func() {
		stdin.Close() // the fakes' process exits when its stdin closes
		done := make(chan struct{})
		go func() { _ = fakes.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = fakes.Process.Kill()
			<-done
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("the fake RTEs did not start: %q %v", line, err)
	}
	a, c, err := startApp(ctx, bin.App, filepath.Join(dir, "seeded"), seed)
	if err != nil {
		return err
	}
	defer a.Stop()
	if !testenv.Poll(5*time.Minute, func() bool {
		runners, err := c.Runners(ctx)
		if err != nil {
			return false
		}
		res.Connected = 0
		for _, r := range runners {
			if r.Connected {
				res.Connected++
			}
		}
		return res.Connected == res.Sockets
	}) {
		return fmt.Errorf("the app connected %d of %d fake RTEs within 5 minutes; its log:\n%s", res.Connected, res.Sockets, testenv.Tail(a.Log(), 20))
	}
	time.Sleep(settle)
	res.AppSockRSS, err = RSS(a.Pid())
	return err
}

// The environment that turns rte-bench (or the package's test binary) into the fake RTEs'
// process; see ServeFakesFromEnv.
const (
	envFakes     = "RTE_BENCH_FAKE_RTES"
	envFakesSeed = "RTE_BENCH_FAKE_SEED"
)

// ServeFakesFromEnv, called first thing in main (and TestMain), does nothing unless
// RTE_BENCH_FAKE_RTES=N is set; then it serves N fake RTEs (package apptest: the real wire
// protocol over TLS, one listener each, one certificate for all), writes the app's seed naming
// them to RTE_BENCH_FAKE_SEED, prints "ready", serves until its stdin closes, and exits.
// They run in their own process so that the app node's memory is measured alone.
func ServeFakesFromEnv() {
	v := os.Getenv(envFakes)
	if v == "" {
		return
	}
	if err := serveFakes(v, os.Getenv(envFakesSeed)); err != nil {
		fmt.Fprintf(os.Stderr, "fake RTEs: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serveFakes(count, seed string) error {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return fmt.Errorf("%s=%q is not a positive number", envFakes, count)
	}
	if seed == "" {
		return fmt.Errorf("%s is not set", envFakesSeed)
	}
	if err := raiseFileLimit(uint64(2*n + 1024)); err != nil {
		return err
	}
	cert, err := apptest.SelfSigned()
	if err != nil {
		return err
	}
	sha := protocol.CertificateSHA256(cert.Certificate[0])
	var b strings.Builder
	b.WriteString("runners:\n")
	fakes := make([]*apptest.RTE, 0, n)
	defer func() {
		for _, f := range fakes {
			f.Close()
		}
	}()
	for i := 0; i < n; i++ {
		name, token := fmt.Sprintf("fake-%04d", i), settings.NewToken()
		f, err := apptest.New(apptest.Config{Name: name, Token: token, Certificate: &cert})
		if err != nil {
			return err
		}
		fakes = append(fakes, f)
		fmt.Fprintf(&b, "  - name: %s\n    rte_mode: inbound\n    url: %s\n    token: %s\n    certificate_sha256: %s\n", name, f.URL(), token, sha)
	}
	if err := os.WriteFile(seed, []byte(b.String()), 0o600); err != nil {
		return err
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
