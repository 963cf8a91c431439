package chaos

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"
)

//go:embed playbooks
var playbooks embed.FS

// harness is one run: the cluster, the schedule and the locks that order faults.
type harness struct {
	cfg    *Config
	c      *cluster
	faults []*fault
	began  time.Time
	sayMu  sync.Mutex
	// nodeLane lets one node-kill run at a time, so one node always serves; bundleLane one
	// bundle-cut, since each rewrites the playbooks' ballast.
	nodeLane   sync.Mutex
	bundleLane sync.Mutex
}

func (h *harness) say(format string, args ...any) {
	h.sayMu.Lock()
	defer h.sayMu.Unlock()
	fmt.Fprintf(h.cfg.Log, format+"\n", args...)
}

func (h *harness) since(t time.Time) float64 { return t.Sub(h.began).Seconds() }

// Run runs the harness once and returns its report; an error means the harness itself could
// not run (a binary did not build, a process did not start), not that an invariant broke:
// that is Report.Failed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	h := &harness{cfg: &cfg}
	rep := &Report{Seed: cfg.Seed, ByStatus: map[string]int{}}
	if os.Geteuid() != 0 && slices.Contains(cfg.Kinds, SpoolFull) {
		cfg.Kinds = slices.DeleteFunc(cfg.Kinds, func(k Kind) bool { return k == SpoolFull })
		rep.Skipped = append(rep.Skipped, "spool-full: mounting a small tmpfs for each spool needs root")
	}
	if len(cfg.Kinds) == 0 && cfg.Faults > 0 {
		return nil, errors.New("no fault kind is left to inject")
	}
	dir, err := workDir(cfg.Out)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cfg.Keep {
			h.say("kept %s (app-a.log, app-b.log, rte-N.log, app.db, the spools)", dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			h.say("remove %s: %v", dir, err)
		}
	}()
	// Closing idle keep-alive connections of the API clients at the end leaves no goroutine
	// behind the run (the test checks with goleak).
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	defer probeClient.CloseIdleConnections()

	h.say("rte-chaos: seed %d, %d faults of %s, %d RTEs, %d jobs in flight, work directory %s",
		cfg.Seed, cfg.Faults, kindNames(cfg.Kinds), cfg.RTEs, cfg.Jobs, dir)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6661756c7473))
	h.faults = schedule(rng, &cfg)
	for _, f := range h.faults {
		h.say("schedule: %s after %.1fs", f, f.Gap.Seconds())
	}

	c := &cluster{cfg: &cfg, dir: dir, dbPath: filepath.Join(dir, "app.db"), adminToken: settings.NewToken(), say: h.say}
	h.c = c
	if err := c.binaries(dir); err != nil {
		return nil, err
	}
	if err := c.files(); err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.stop()
		}
	}()
	h.began = time.Now()
	if err := c.startNodes(ctx); err != nil {
		return nil, err
	}
	if err := c.startRTEs(ctx, slices.Contains(cfg.Kinds, SpoolFull)); err != nil {
		return nil, err
	}
	h.say("+%6.1fs cluster up: app-a and app-b on %s, %d RTEs", h.since(time.Now()), c.dbPath, len(c.rtes))

	d := newDriver(c, cfg.Seed)
	driveCtx, stopDriving := context.WithCancel(ctx)
	driving := make(chan struct{})
	go func() { defer close(driving); d.run(driveCtx) }()
	h.inject(ctx)
	stopDriving()
	<-driving
	rep.SubmitFailures = d.failures
	h.say("+%6.1fs all %d faults injected; waiting up to %s for every job to end", h.since(time.Now()), len(h.faults), cfg.Settle)
	if err := c.waitEnded(ctx, cfg.Settle); err != nil {
		h.say("%v", err)
	}
	rep.Duration = time.Since(h.began)
	rep.Faults = h.faults
	stopped = true
	if err := c.stop(); err != nil {
		rep.Violations = append(rep.Violations, "stopping the cluster: "+err.Error())
	}
	rep.Violations = append(rep.Violations, c.crashes()...)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep.faultViolations()
	if err := check(ctx, c.dbPath, h.faults, c.rtes, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

func kindNames(kinds []Kind) string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ",")
}

func workDir(out string) (string, error) {
	if out == "" {
		return os.MkdirTemp("", "rte-chaos-")
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return "", err
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return "", err
	}
	if len(entries) > 0 {
		return "", fmt.Errorf("-out %s is not empty: give a new or empty directory, so one run's database and logs are not mixed with another's", out)
	}
	return filepath.Abs(out)
}

// binaries uses the given rte and rte-app binaries, or builds them into dir/bin.
func (c *cluster) binaries(dir string) error {
	c.rteBin, c.appBin = c.cfg.RTEBin, c.cfg.AppBin
	if c.rteBin != "" && c.appBin != "" {
		return nil
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	root := filepath.Dir(strings.TrimSpace(string(out)))
	if err != nil || root == "." || root == "" {
		return fmt.Errorf("find the module to build rte and rte-app (go env GOMOD: %v); run inside the repository, or pass -rte and -rte-app", err)
	}
	bin := filepath.Join(dir, "bin")
	var names []string
	if c.rteBin == "" {
		names, c.rteBin = append(names, "rte"), filepath.Join(bin, "rte")
	}
	if c.appBin == "" {
		names, c.appBin = append(names, "rte-app"), filepath.Join(bin, "rte-app")
	}
	return testenv.Build(bin, root, c.cfg.Race, names...)
}

// files writes the playbooks and the inventory the app sends to the RTEs.
func (c *cluster) files() error {
	c.playbooks = filepath.Join(c.dir, "playbooks")
	for _, d := range []string{c.playbooks, filepath.Join(c.dir, "inventory")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	book, err := playbooks.ReadFile("playbooks/lines.yml")
	if err != nil {
		return err
	}
	inv, err := playbooks.ReadFile("playbooks/local.ini")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.playbooks, "lines.yml"), book, 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.dir, "inventory", "local.ini"), inv, 0o600)
}
