package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/rte-project/rte/internal/logging"
	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"

	"github.com/caarlos0/env/v11"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/protocol"
)

// Demo timing; variables so a test can shorten them.
var (
	demoStartTimeout    = 30 * time.Second // the RTE's "rte starting" log line
	demoRegisterTimeout = time.Minute      // the RTE's registration reaching the app
	demoConnectTimeout  = time.Minute      // the app's pinned socket to the approved RTE
	demoStopTimeout     = 40 * time.Second // the RTE's drain (RTE_DRAIN_SECONDS=10) and exit
	demoPoll            = 200 * time.Millisecond
)

const (
	demoRunner   = "demo-rte"
	demoJobLimit = 600 // seconds: the example playbook takes a few
)

// demoOptions are the demo's flags, resolved to absolute paths.
type demoOptions struct {
	rte      string // the rte binary
	examples string // holds playbooks/site.yml and inventory/hosts.yml
	ssh      bool   // add a second host reached over a real sshd on loopback
	files    string // the RTE's RTE_FILES: transfer (the app sends examples/) or local
	verbose  bool   // echo the app's and the RTE's logs
	keep     bool   // keep the work directory
	path     string // PATH for the RTE, so it finds ansible-playbook
}

func Run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("demo", stdout, stderr)
	var o demoOptions
	fs.StringVar(&o.rte, "rte", "", "the rte binary (default: rte next to rte-app, else on PATH)")
	fs.StringVar(&o.examples, "examples", "examples", "the directory holding playbooks/site.yml and inventory/hosts.yml")
	fs.BoolVar(&o.ssh, "ssh", sshDefault(), "also run the playbook on a second host over a real sshd on 127.0.0.1 (default on as root when "+testenv.SSHDPath+" exists)")
	fs.StringVar(&o.files, "files", "transfer", "the RTE's RTE_FILES: transfer (the app packs examples/ and sends it) or local (the RTE reads examples/ itself)")
	fs.BoolVar(&o.verbose, "verbose", false, "also print the app's and the RTE's logs")
	fs.BoolVar(&o.keep, "keep", false, "keep the work directory (logs, database, spool) for a look afterwards")
	if err := cli.NoArgs(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cli.ExitOK
		}
		return cli.ExitUsage
	}
	o.path = env.ToMap(environ)["PATH"]
	if err := o.resolve(); err != nil {
		fmt.Fprintf(stderr, "rte-app demo: %v\n", err)
		return cli.ExitUsage
	}
	d := &demoRun{o: o, out: stdout, errOut: stderr}
	return d.run(ctx)
}

// resolve finds the rte binary and the examples, and checks that ansible-playbook is there.
func (o *demoOptions) resolve() error {
	if o.rte == "" {
		if self, err := os.Executable(); err == nil {
			if next := filepath.Join(filepath.Dir(self), "rte"); isExecutable(next) {
				o.rte = next
			}
		}
		if o.rte == "" {
			p, err := exec.LookPath("rte")
			if err != nil {
				return errors.New("no rte binary next to rte-app or on PATH: build both with go build -o bin/ ./cmd/... and run bin/rte-app demo, or pass --rte PATH")
			}
			o.rte = p
		}
	}
	if !isExecutable(o.rte) {
		return fmt.Errorf("--rte %s is not an executable file", o.rte)
	}
	if o.files != protocol.FilesTransfer && o.files != protocol.FilesLocal {
		return fmt.Errorf("--files %s: use transfer (the app sends the playbooks) or local (the RTE reads them itself)", o.files)
	}
	var err error
	if o.rte, err = filepath.Abs(o.rte); err != nil {
		return err
	}
	if o.examples, err = filepath.Abs(o.examples); err != nil {
		return err
	}
	for _, f := range []string{"playbooks/site.yml", "inventory/hosts.yml"} {
		if _, err := os.Stat(filepath.Join(o.examples, f)); err != nil {
			return fmt.Errorf("--examples %s has no %s: run the demo from the repository's root, or pass --examples PATH/TO/examples", o.examples, f)
		}
	}
	if _, err := lookPathIn("ansible-playbook", o.path); err != nil {
		return errors.New("ansible-playbook is not on PATH, and the RTE needs it to run the playbook: run scripts/deps (it installs Debian's ansible-core)")
	}
	if o.ssh {
		if _, err := os.Stat(testenv.SSHDPath); err != nil {
			return fmt.Errorf("--ssh: %s is missing: run scripts/deps (it installs openssh-server), or pass --ssh=false", testenv.SSHDPath)
		}
		if _, err := lookPathIn("ssh", o.path); err != nil {
			return errors.New("--ssh: ssh is not on PATH: run scripts/deps (it installs openssh-client), or pass --ssh=false")
		}
	}
	return nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// lookPathIn is exec.LookPath over a given PATH, the one the RTE will have.
func lookPathIn(name, path string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// demoRun is one run of the demo. Everything it starts lives in dir and is stopped, in
// reverse order, before run returns.
type demoRun struct {
	o           demoOptions
	out, errOut io.Writer
	dir         string
}

func (d *demoRun) say(format string, args ...any) {
	fmt.Fprintf(d.out, "==> "+format+"\n", args...)
}

func (d *demoRun) fail(format string, args ...any) int {
	fmt.Fprintf(d.errOut, "rte-app demo: "+format+"\n", args...)
	return cli.ExitTrouble
}

func (d *demoRun) run(ctx context.Context) int {
	dir, err := os.MkdirTemp("", "rte-demo-")
	if err != nil {
		return d.fail("make a work directory: %v", err)
	}
	d.dir = dir
	defer func() {
		if d.o.keep {
			d.say("kept %s (app.log, rte/rte.log, app.db, the spool)", dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(d.errOut, "rte-app demo: remove %s: %v\n", dir, err)
			return
		}
		d.say("removed %s", dir)
	}()
	fmt.Fprintf(d.out, "rte-app demo: the reference app, a real RTE over TLS and a real playbook, all on this machine\n")
	fmt.Fprintf(d.out, "    work directory %s (removed at the end; --keep keeps it)\n", dir)

	// The app, in this process, as `rte-app serve` runs it.
	logFile, err := os.Create(filepath.Join(dir, "app.log"))
	if err != nil {
		return d.fail("%v", err)
	}
	defer logFile.Close()
	var logSink io.Writer = logFile
	if d.o.verbose {
		logSink = io.MultiWriter(logFile, &prefixWriter{w: d.errOut, prefix: "app | "})
	}
	logger, err := logging.New("info", "json", logSink)
	if err != nil {
		return d.fail("%v", err)
	}
	dbPath := filepath.Join(dir, "app.db")
	store, err := sqlitestore.Open(dbPath)
	if err != nil {
		return d.fail("open %s: %v", dbPath, err)
	}
	defer store.Close()
	// In transfer mode the app holds the files: its own copy of examples/, packed and sent to
	// the RTE as bundles.
	var files *server.BundleSource
	if d.o.files == protocol.FilesTransfer {
		files, err = server.NewBundleSource(&settings.Settings{
			DB: dbPath, FilesMaxMB: 512, BundleCacheMB: 2048,
			PlaybooksPath: filepath.Join(d.o.examples, "playbooks"),
			InventoryPath: filepath.Join(d.o.examples, "inventory"),
		}, logger)
		if err != nil {
			return d.fail("%v", err)
		}
	}
	a, err := app.New(app.Config{Store: store, Logger: logger, Node: "demo-app", Files: files.FilesConfig()})
	if err != nil {
		return d.fail("%v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return d.fail("listen: %v", err)
	}
	appURL := "http://" + ln.Addr().String()
	adminToken := settings.NewToken()
	// The app outlives an interrupt: it must still carry the cancel to the RTE and take
	// the canceled job's end.
	appCtx, stopApp := context.WithCancel(context.WithoutCancel(ctx))
	appDone := make(chan error, 1)
	go func() { appDone <- server.Serve(appCtx, a, ln, adminToken, logger) }()
	defer func() {
		stopApp()
		if err := <-appDone; err != nil {
			fmt.Fprintf(d.errOut, "rte-app demo: the app stopped with: %v\n", err)
		}
	}()
	d.say("the app listens on %s (SQLite in app.db, log in app.log)", appURL)
	c, err := cli.NewClient(appURL, adminToken)
	if err != nil {
		return d.fail("%v", err)
	}

	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return d.fail("%v", err)
	}
	repoPath := filepath.Join(d.o.examples, "inventory")
	hosts := "localhost"
	if d.o.ssh {
		h, err := startSSHD(ctx, filepath.Join(dir, "sshd"), home)
		if err != nil {
			return d.fail("%v", err)
		}
		defer h.Stop()
		repoPath, err = writeSSHInventory(filepath.Join(dir, "inventory"), h)
		if err != nil {
			return d.fail("%v", err)
		}
		hosts = "localhost and ssh-loopback"
		if files != nil {
			files.SetInventory(repoPath) // set before the RTE starts, so before any job reads it
		}
		d.say("sshd listens on 127.0.0.1:%d with host key %s, known to the RTE's ssh in advance", h.Port, h.HostKeyFP)
	}

	// The RTE, a real process, registering itself with the app.
	port, err := testenv.FreePort()
	if err != nil {
		return d.fail("%v", err)
	}
	rteDir := filepath.Join(dir, "rte")
	rteURL := fmt.Sprintf("https://127.0.0.1:%d", port)
	rteEnv := []string{
		"PATH=" + d.o.path,
		"HOME=" + home,
		"LANG=C.UTF-8",
		"RTE_TOKEN=" + settings.NewToken(),
		"RTE_NAME=" + demoRunner,
		"HTTPS=1",
		"HTTPS_CERT=" + filepath.Join(rteDir, "certificates", "cert.pem"),
		"HTTPS_KEY=" + filepath.Join(rteDir, "certificates", "key.pem"),
		"LISTEN_HOST=127.0.0.1",
		"PORT=" + strconv.Itoa(port),
		"RTE_URL=" + rteURL,
		"APP_URL=" + appURL,
		"RTE_FILES=" + d.o.files,
		"RTE_SPOOL_PATH=" + filepath.Join(rteDir, "spool"),
		"RTE_WORK_PATH=" + filepath.Join(rteDir, "jobs"),
		"RTE_CACHE_PATH=" + filepath.Join(rteDir, "cache"),
		"RTE_DRAIN_SECONDS=10",
		"LOG_FORMAT=json",
		"LOG_LEVEL=info",
	}
	if d.o.files == protocol.FilesLocal {
		rteEnv = append(rteEnv, "ANSIBLE_PATH="+filepath.Join(d.o.examples, "playbooks"), "REPO_PATH="+repoPath)
	}
	var echo io.Writer
	if d.o.verbose {
		echo = &prefixWriter{w: d.errOut, prefix: "rte | "}
	}
	rte, err := startRTE(d.o.rte, rteDir, rteEnv, echo)
	if err != nil {
		return d.fail("%v", err)
	}
	defer func() {
		d.say("stopping the RTE%s and the app", map[bool]string{true: ", sshd", false: ""}[d.o.ssh])
		if err := rte.Stop(demoStopTimeout); err != nil {
			fmt.Fprintf(d.errOut, "rte-app demo: %v\n", err)
		}
	}()
	d.say("started the RTE (%s) on %s with a self-signed certificate, RTE_FILES=%s", d.o.rte, rteURL, d.o.files)

	logged, err := rte.WaitStarting(ctx, demoStartTimeout)
	if err != nil {
		return d.fail("%v", err)
	}
	runner, err := d.waitFor(ctx, c, rte, demoRegisterTimeout, "the RTE's registration", func(r api.RunnerView) bool {
		return r.PendingCertificate != nil
	})
	if err != nil {
		return d.fail("%v", err)
	}
	if !d.compare(logged, runner) {
		return cli.ExitTrouble
	}
	if _, err := c.Approve(ctx, demoRunner, runner.PendingCertificate.Fingerprint, runner.PendingCertificate.SHA256); err != nil {
		return d.fail("approve: %v", err)
	}
	d.say("approved %s: the app now dials %s and trusts only certificate %s", demoRunner, rteURL, runner.PendingCertificate.Fingerprint)
	runner, err = d.waitFor(ctx, c, rte, demoConnectTimeout, "the app's pinned connection to the RTE", func(r api.RunnerView) bool {
		return r.Connected
	})
	if err != nil {
		return d.fail("%v", err)
	}
	d.say("connected over the pinned certificate: %s runs ansible-core %s", demoRunner, cli.OrDash(runner.AnsibleVersion))

	job, err := c.Submit(ctx, api.JobRequest{Runner: demoRunner, JobOptions: api.JobOptions{
		Playbook: "site.yml", Inventories: []string{"hosts.yml"}, TimeoutS: demoJobLimit,
	}})
	if err != nil {
		return d.fail("submit the job: %v", err)
	}
	d.say("running site.yml on %s as job %s\n", hosts, job.ID)
	code := cli.FollowAndReport(ctx, c, job.ID, d.out, d.errOut)
	if code == cli.ExitTrouble || (code == cli.ExitNotEnded && ctx.Err() == nil) {
		fmt.Fprintf(d.errOut, "\nthe RTE's last log lines:\n%s\n", rte.LogTail(15))
	}
	return code
}

// waitFor polls the runner list until the demo runner satisfies ok, the RTE exits, ctx ends
// or timeout passes.
func (d *demoRun) waitFor(ctx context.Context, c *cli.Client, rte *demoRTE, timeout time.Duration, what string, ok func(api.RunnerView) bool) (api.RunnerView, error) {
	deadline := time.Now().Add(timeout)
	for {
		runners, err := c.Runners(ctx)
		if err != nil && ctx.Err() == nil {
			return api.RunnerView{}, err
		}
		for _, r := range runners {
			if r.Name == demoRunner && ok(r) {
				return r, nil
			}
		}
		select {
		case <-rte.Done():
			return api.RunnerView{}, fmt.Errorf("the RTE exited while waiting for %s (%v); its log:\n%s", what, rte.Err(), rte.LogTail(25))
		case <-ctx.Done():
			return api.RunnerView{}, fmt.Errorf("interrupted while waiting for %s", what)
		case <-time.After(demoPoll):
		}
		if time.Now().After(deadline) {
			return api.RunnerView{}, fmt.Errorf("no %s after %s; the RTE's log:\n%s", what, timeout, rte.LogTail(25))
		}
	}
}

// compare prints the fingerprints the RTE logged beside those the app received, as an admin
// compares them before approving, and reports whether every pair matches.
func (d *demoRun) compare(logged map[string]string, r api.RunnerView) bool {
	rows := []struct{ name, rte, app string }{
		{"token", logged["token_fingerprint"], r.TokenFingerprint},
		{"certificate", logged["certificate_fingerprint"], r.PendingCertificate.Fingerprint},
		{"certificate sha256", logged["certificate_sha256"], r.PendingCertificate.SHA256},
	}
	d.say("%s registered and waits for approval. An admin compares what the RTE logged at start", demoRunner)
	fmt.Fprintf(d.out, "    (its \"rte starting\" line) with what the app received, and approves only if they are the same:\n")
	same := true
	for _, row := range rows {
		verdict := "same"
		if row.rte == "" || row.rte != row.app {
			verdict, same = "DIFFERENT", false
		}
		if len(row.rte) > 20 || len(row.app) > 20 {
			fmt.Fprintf(d.out, "    %-20s RTE %s\n    %-20s app %s   %s\n", row.name, cli.OrDash(row.rte), "", cli.OrDash(row.app), verdict)
		} else {
			fmt.Fprintf(d.out, "    %-20s RTE %-12s app %-12s %s\n", row.name, cli.OrDash(row.rte), cli.OrDash(row.app), verdict)
		}
	}
	if !same {
		fmt.Fprintf(d.errOut, "\nrte-app demo: THE FINGERPRINTS DO NOT MATCH: the app did not receive what the RTE logged.\n"+
			"Something other than the demo's RTE answered, or registered under its name. Not approving.\n")
	}
	return same
}

// writeSSHInventory writes the demo's inventory with the ssh host beside localhost and returns
// its directory, the RTE's REPO_PATH. ssh reads known_hosts from the user's passwd home, not
// from HOME, so the inventory names the files explicitly; host key checking stays on.
func writeSSHInventory(dir string, h *sshHost) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	sshArgs := fmt.Sprintf("-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes", h.KnownHosts)
	inv := map[string]any{
		"all": map[string]any{
			"hosts": map[string]any{
				"localhost": map[string]any{
					"ansible_connection":         "local",
					"ansible_python_interpreter": "{{ ansible_playbook_python }}",
				},
				"ssh-loopback": map[string]any{
					"ansible_host":                 "127.0.0.1",
					"ansible_port":                 h.Port,
					"ansible_user":                 h.User,
					"ansible_connection":           "ssh",
					"ansible_ssh_private_key_file": h.IdentityFile,
					"ansible_ssh_common_args":      sshArgs,
					"ansible_python_interpreter":   "{{ ansible_playbook_python }}",
				},
			},
		},
	}
	// JSON is YAML, and encoding/json quotes every value safely.
	b, err := json.MarshalIndent(inv, "", "  ")
	if err != nil {
		return "", err
	}
	header := "# Written by rte-app demo: this machine twice, once directly and once over a private sshd.\n"
	if err := os.WriteFile(filepath.Join(dir, "hosts.yml"), append([]byte(header), b...), 0o600); err != nil {
		return "", err
	}
	return dir, nil
}
