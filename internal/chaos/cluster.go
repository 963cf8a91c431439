package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/settings"
	"github.com/rte-project/rte/internal/testenv"
)

// Keepalive of the RTEs: short, so that a stalled socket is found dead in seconds. The app's
// side keeps the protocol's defaults (rte-app serve has no setting for them): a stall ends
// when the RTE gives the socket up and the forwarder flows again, which closes it at the app.
const (
	rtePing      = "1s"
	rteDeadAfter = 4 * time.Second
	drainSeconds = 3
	spoolMB      = 64 // the tmpfs under each RTE's spool, for spool-full
	startLimit   = 60 * time.Second
)

// child is a process the harness starts, kills and starts again: its current run, and its
// log file, which every run appends to.
type child struct {
	name string
	bin  string
	args []string
	dir  string
	env  []string

	mu   sync.Mutex
	proc *testenv.RTE // testenv's child launcher, which runs any binary
	log  *os.File
	// expecting is set by expectExit just before the harness kills or stops the process; an
	// exit without it is a crash, noted in crashes.
	expecting bool
	crashes   []string
	watchers  sync.WaitGroup
}

// expectExit marks the process's next exit as the harness's doing.
func (ch *child) expectExit() {
	ch.mu.Lock()
	ch.expecting = true
	ch.mu.Unlock()
}

// watch notes the process's exit as a crash unless expectExit came first.
func (ch *child) watch(p *testenv.RTE) {
	defer ch.watchers.Done()
	<-p.Done()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !ch.expecting {
		ch.crashes = append(ch.crashes, fmt.Sprintf("%s exited on its own (%v); its last lines:\n%s", ch.name, p.Err(), testenv.Tail(p.Log(), 10)))
	}
	ch.expecting = false
}

// node is one `rte-app serve` process.
type node struct {
	child
	url    string
	client *cli.Client
}

// rteBox is one RTE: its process (replaced at each restart), its forwarder and its spool.
type rteBox struct {
	child
	spool string
	tmpfs bool
	fwd   *testenv.Forwarder
}

// cluster is everything the harness started.
type cluster struct {
	cfg        *Config
	dir        string
	dbPath     string
	playbooks  string
	appBin     string
	rteBin     string
	adminToken string
	nodes      []*node
	rtes       []*rteBox
	say        func(format string, args ...any)
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// client is the admin API of a node that answers, trying them in turn from a given index.
func (c *cluster) client(ctx context.Context, from int) (*cli.Client, error) {
	var last error
	for i := range c.nodes {
		n := c.nodes[(from+i)%len(c.nodes)]
		if n.alive() {
			return n.client, nil
		}
		last = fmt.Errorf("node %s is down", n.name)
	}
	return nil, last
}

func (ch *child) current() *testenv.RTE {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.proc
}

func (ch *child) alive() bool {
	p := ch.current()
	if p == nil {
		return false
	}
	select {
	case <-p.Done():
		return false
	default:
		return true
	}
}

// start starts the process, its output appended to logDir/<name>.log, and waits until a GET
// of probe answers 200.
func (ch *child) start(ctx context.Context, logDir, probe string) error {
	ch.mu.Lock()
	if ch.log == nil {
		f, err := os.OpenFile(filepath.Join(logDir, ch.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			ch.mu.Unlock()
			return err
		}
		ch.log = f
	}
	p, err := testenv.LaunchRTE(testenv.RTEConfig{Bin: ch.bin, Args: ch.args, Dir: ch.dir, Env: ch.env,
		Log: ch.log, SysProcAttr: testenv.OwnGroupTiedToParent()})
	if err == nil {
		ch.proc = p
		ch.expecting = false
		ch.watchers.Add(1)
		go ch.watch(p)
	}
	ch.mu.Unlock()
	if err != nil {
		return fmt.Errorf("start %s: %w", ch.name, err)
	}
	up := testenv.Poll(startLimit, func() bool {
		select {
		case <-p.Done():
			return true
		default:
		}
		return get(ctx, probe) == http.StatusOK
	})
	select {
	case <-p.Done():
		return fmt.Errorf("%s exited at start (%v):\n%s", ch.name, p.Err(), testenv.Tail(p.Log(), 20))
	default:
	}
	if !up {
		return fmt.Errorf("%s: %s did not answer 200 within %s:\n%s", ch.name, probe, startLimit, testenv.Tail(p.Log(), 20))
	}
	return nil
}

// stop ends the process (SIGTERM, then SIGKILL after 30 s) and closes its log.
func (ch *child) stop() error {
	var err error
	ch.expectExit()
	if p := ch.current(); p != nil {
		if err = p.Stop(30 * time.Second); err != nil {
			err = fmt.Errorf("%s: %w", ch.name, err)
		}
		<-p.Done()
	}
	ch.watchers.Wait()
	if ch.log != nil {
		ch.log.Close()
	}
	return err
}

func (c *cluster) startNodes(ctx context.Context) error {
	secretKey := settings.NewToken()
	for _, name := range []string{"app-a", "app-b"} {
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		dir := filepath.Join(c.dir, name)
		url := fmt.Sprintf("http://127.0.0.1:%d", port)
		client, err := cli.NewClient(url, c.adminToken)
		if err != nil {
			return err
		}
		n := &node{url: url, client: client, child: child{name: name, bin: c.appBin, args: []string{"serve"}, dir: dir, env: []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "LANG=C.UTF-8",
			"APP_LISTEN=127.0.0.1:" + strconv.Itoa(port), "APP_DB=" + c.dbPath, "APP_NODE=" + name,
			"APP_ADMIN_TOKEN=" + c.adminToken, "APP_SECRET_KEY=" + secretKey,
			"APP_PLAYBOOKS_PATH=" + c.playbooks, "APP_INVENTORY_PATH=" + filepath.Join(c.dir, "inventory"),
			"LOG_LEVEL=info", "LOG_FORMAT=json",
		}}}
		c.nodes = append(c.nodes, n)
		if err := c.startNode(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// startNode starts the node's process and waits until its /ready answers 200.
func (c *cluster) startNode(ctx context.Context, n *node) error {
	return n.start(ctx, c.dir, n.url+"/ready")
}

// get is the status of a GET of url, 0 when it fails. It accepts any certificate: it probes
// an RTE's /ready, which is not the pinned path.
func get(ctx context.Context, url string) int {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode
}

var probeClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // probes only; the app pins
	DisableKeepAlives: true,
}}

func (c *cluster) startRTEs(ctx context.Context, spoolFull bool) error {
	for i := range c.cfg.RTEs {
		name := fmt.Sprintf("rte-%d", i+1)
		dir := filepath.Join(c.dir, name)
		port, err := testenv.FreePort()
		if err != nil {
			return err
		}
		fwd, err := testenv.NewForwarder(fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		r := &rteBox{child: child{name: name, bin: c.rteBin, dir: dir}, spool: filepath.Join(dir, "spool"), fwd: fwd}
		c.rtes = append(c.rtes, r)
		if err := os.MkdirAll(r.spool, 0o700); err != nil {
			return err
		}
		if spoolFull {
			// A small file system of its own, so that filling it fills only this spool.
			out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm,mode=0700", spoolMB), "tmpfs", r.spool).CombinedOutput()
			if err != nil {
				return fmt.Errorf("mount a tmpfs on %s for spool-full: %v: %s", r.spool, err, out)
			}
			r.tmpfs = true
		}
		// Each RTE registers through one node; the other node dials it as well when it holds
		// its lease.
		registerAt := c.nodes[i%len(c.nodes)].url
		r.env = []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(dir, "home"), "LANG=C.UTF-8",
			"RTE_TOKEN=" + settings.NewToken(), "RTE_NAME=" + name,
			"HTTPS=1", "HTTPS_CERT=" + filepath.Join(dir, "certificates", "cert.pem"),
			"HTTPS_KEY=" + filepath.Join(dir, "certificates", "key.pem"),
			"LISTEN_HOST=127.0.0.1", "PORT=" + strconv.Itoa(port),
			"RTE_URL=https://" + fwd.Addr(), "APP_URL=" + registerAt,
			"RTE_FILES=transfer", "RTE_SPOOL_PATH=" + r.spool,
			"RTE_WORK_PATH=" + filepath.Join(dir, "jobs"), "RTE_CACHE_PATH=" + filepath.Join(dir, "cache"),
			"RTE_DRAIN_SECONDS=" + strconv.Itoa(drainSeconds),
			"RTE_PING_INTERVAL=" + rtePing, "RTE_DEAD_AFTER=" + rteDeadAfter.String(),
			"LOG_FORMAT=json", "LOG_LEVEL=info",
		}
		if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
			return err
		}
		if err := c.startRTE(ctx, r); err != nil {
			return err
		}
	}
	for _, r := range c.rtes {
		if err := c.approve(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// startRTE starts the RTE's process and waits for its /live.
func (c *cluster) startRTE(ctx context.Context, r *rteBox) error {
	return r.start(ctx, c.dir, "https://"+r.addr()+"/live")
}

// addr is the RTE's own listener, host:port (not its forwarder).
func (r *rteBox) addr() string {
	for _, kv := range r.env {
		if v, ok := cutPrefix(kv, "PORT="); ok {
			return "127.0.0.1:" + v
		}
	}
	return ""
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return "", false
}

// approve waits for the RTE's registration and approves the certificate it presented, as
// an admin does after comparing fingerprints, then waits until a node holds its socket.
func (c *cluster) approve(ctx context.Context, r *rteBox) error {
	var pending *api.CertificateView
	if !testenv.Poll(startLimit, func() bool {
		cl, err := c.client(ctx, 0)
		if err != nil {
			return false
		}
		runners, err := cl.Runners(ctx)
		if err != nil {
			return false
		}
		for _, v := range runners {
			if v.Name == r.name && v.PendingCertificate != nil {
				pending = v.PendingCertificate
				return true
			}
		}
		return false
	}) {
		return fmt.Errorf("%s did not register within %s:\n%s", r.name, startLimit, testenv.Tail(r.current().Log(), 20))
	}
	cl, err := c.client(ctx, 0)
	if err != nil {
		return err
	}
	if _, err := cl.Approve(ctx, r.name, pending.Fingerprint, pending.SHA256); err != nil {
		return fmt.Errorf("approve %s: %w", r.name, err)
	}
	if !testenv.Poll(startLimit, func() bool { v, ok := c.runner(ctx, r.name); return ok && v.Connected }) {
		return fmt.Errorf("no node connected to %s within %s:\n%s", r.name, startLimit, testenv.Tail(r.current().Log(), 20))
	}
	c.say("%s approved (certificate %s), its RTE listens on %s behind forwarder %s", r.name, pending.Fingerprint, r.addr(), r.fwd.Addr())
	return nil
}

// runner is the runner as a live node sees it.
func (c *cluster) runner(ctx context.Context, name string) (api.RunnerView, bool) {
	cl, err := c.client(ctx, 0)
	if err != nil {
		return api.RunnerView{}, false
	}
	runners, err := cl.Runners(ctx)
	if err != nil {
		return api.RunnerView{}, false
	}
	for _, v := range runners {
		if v.Name == name {
			return v, true
		}
	}
	return api.RunnerView{}, false
}

// crashes lists every exit of a process the harness did not cause.
func (c *cluster) crashes() []string {
	var out []string
	for _, ch := range c.children() {
		ch.mu.Lock()
		out = append(out, ch.crashes...)
		ch.mu.Unlock()
	}
	return out
}

func (c *cluster) children() []*child {
	var out []*child
	for _, n := range c.nodes {
		out = append(out, &n.child)
	}
	for _, r := range c.rtes {
		out = append(out, &r.child)
	}
	return out
}

// stop ends every process (SIGTERM, then SIGKILL), closes the forwarders and unmounts the
// spools' file systems.
func (c *cluster) stop() error {
	var errs []error
	for _, r := range c.rtes {
		errs = append(errs, r.stop())
		r.fwd.Close()
		if r.tmpfs {
			if out, err := exec.Command("umount", "-l", r.spool).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("umount %s: %v: %s", r.spool, err, out))
			}
		}
	}
	for _, n := range c.nodes {
		errs = append(errs, n.stop())
	}
	return errors.Join(errs...)
}
