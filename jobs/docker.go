package jobs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/rte-project/rte/protocol"
)

// Pull policies of ContainerConfig.Pull (RTE_PULL).
const (
	PullNever     = "never"
	PullIfMissing = "if-missing"
	PullAlways    = "always"
)

// Labels on every job container: the RTE's name and the job's id. A restarted RTE removes the
// containers labelled with its own name (RemoveContainers), never another RTE's.
const (
	LabelName = "rte.name"
	LabelJob  = "rte.job"
)

// nobody is the user a job's container runs as when the RTE runs as root: the job directory
// is handed to it for the job's run, so the playbook owns nothing else.
const nobody = 65534

// dockerAPITimeout bounds one call to the engine that should be quick (create, start, kill,
// remove, inspect); waiting for the container's end and pulling are not bounded by it.
const dockerAPITimeout = 30 * time.Second

// ContainerConfig is RTE_ENGINE=docker: where the engine's API is and how each job's
// container is made.
type ContainerConfig struct {
	// Host is the engine's API address, DOCKER_HOST style (unix:///var/run/docker.sock).
	Host string
	// Image is RTE_IMAGE, the execution environment a job runs in unless it names another.
	Image string
	// Allow is RTE_IMAGES_ALLOW: the other images a job may name (protocol.JobStart.Image),
	// exact references or patterns where * stands for any characters but "/" (path.Match).
	Allow []string
	// Podman is RTE_ENGINE=podman: the same API, through Podman's Docker-compatible service,
	// with the few differences it needs (podmanUlimits).
	Podman bool
	// Pull is PullNever, PullIfMissing or PullAlways.
	Pull string
	// Network is RTE_JOB_NETWORK: the network the job's container joins ("none" cuts it off).
	Network string
	// NanoCPUs and MemoryBytes are RTE_JOB_CPUS and RTE_JOB_MEMORY; 0 sets no limit.
	NanoCPUs    int64
	MemoryBytes int64
	// Name is RTE_NAME, the value of the rte.name label.
	Name string
}

func (c *ContainerConfig) validate() error {
	var problems []error
	if c.Host == "" {
		problems = append(problems, errors.New("Containers.Host (RTE_ENGINE_HOST) is required"))
	}
	if c.Image == "" {
		problems = append(problems, errors.New("Containers.Image (RTE_IMAGE) is required with a container engine"))
	}
	if c.Name == "" {
		problems = append(problems, errors.New("Containers.Name (RTE_NAME) is required: it labels the job containers"))
	}
	for _, p := range c.Allow {
		if _, err := path.Match(p, ""); err != nil || !protocol.ValidImagePattern(p) {
			problems = append(problems, fmt.Errorf("Containers.Allow (RTE_IMAGES_ALLOW) has %q: not an image reference or pattern", p))
		}
	}
	switch c.Pull {
	case PullNever, PullIfMissing, PullAlways:
	default:
		problems = append(problems, fmt.Errorf("Containers.Pull (RTE_PULL) is %q: use never, if-missing or always", c.Pull))
	}
	return errors.Join(problems...)
}

// Images are the images a job may name, as hello shows them: the default first, then the
// allowlist as the operator wrote it.
func (c *ContainerConfig) Images() []string {
	return append([]string{c.Image}, c.Allow...)
}

// allows reports whether a job may run in image: the default, or one the allowlist matches
// (protocol.ImageAllowed, the rule the app also applies at submit).
func (c *ContainerConfig) allows(image string) bool {
	return protocol.ImageAllowed(c.Images(), image)
}

// newDockerClient talks to the engine at host, at the highest API version both sides know
// (this machine's engine answers 1.41, the client speaks up to 1.57).
func newDockerClient(host string) (*client.Client, error) {
	cli, err := client.New(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("container engine at %s: %w", host, err)
	}
	return cli, nil
}

// dockerEngine runs each job in a fresh container of ContainerConfig.Image.
//
// Output and events travel through two named pipes in the job's private directory, which the
// container writes (the shell there opens them for ansible-playbook's stdout+stderr and fd 3)
// and the RTE reads. That keeps the batching exactly as with process groups: one ordered byte
// stream for output, one for events, EOF when the last writer is gone. Attaching to the
// container's stdout would need the engine's multiplexed stream framing for output and still a
// second channel for events; the pipes need neither, and nothing of the job's output passes
// through the engine's log driver (which would keep an unmasked copy on the engine's disk).
type dockerEngine struct {
	cfg      ContainerConfig
	cli      *client.Client
	log      *zap.Logger
	uid, gid int    // the container's user
	plugins  string // the RTE's af_events plugin directory, copied into each job's

	homesMu sync.Mutex
	homes   map[string]string // image id -> the container user's passwd home there (homeIn)
}

func newDockerEngine(cfg ContainerConfig, plugins string, log *zap.Logger) (*dockerEngine, error) {
	cli, err := newDockerClient(cfg.Host)
	if err != nil {
		return nil, err
	}
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = nobody, nobody
	}
	return &dockerEngine{cfg: cfg, cli: cli, log: log, uid: uid, gid: gid, plugins: plugins, homes: map[string]string{}}, nil
}

func (d *dockerEngine) ready(ctx context.Context, image string) error {
	if _, err := d.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return fmt.Errorf("the container engine at %s does not answer (RTE_ENGINE_HOST): %v", d.cfg.Host, err)
	}
	if d.cfg.Pull != PullNever {
		return nil
	}
	setting := "RTE_IMAGE"
	if image == "" {
		image = d.cfg.Image
	} else if image != d.cfg.Image {
		setting = "named by the job, allowed by RTE_IMAGES_ALLOW"
	}
	if _, err := d.cli.ImageInspect(ctx, image); err != nil {
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("the job image %s (%s) is not on the container engine and RTE_PULL=never: load or build it there (./scripts/image builds rte:dev), or set RTE_PULL=if-missing", image, setting)
		}
		return fmt.Errorf("look up the job image %s (%s): %v", image, setting, err)
	}
	return nil
}

func (d *dockerEngine) close() error { return d.cli.Close() }

// pluginDir copies the af_events plugin into the job's private directory: the container sees
// only that directory of the RTE.
func (d *dockerEngine) pluginDir(p private) (string, error) {
	dst := filepath.Join(p.dir, "plugins")
	if err := os.CopyFS(dst, os.DirFS(d.plugins)); err != nil {
		return "", fmt.Errorf("copy the af_events plugin into the job directory: %v", err)
	}
	return dst, nil
}

// runScript opens the two pipes for ansible-playbook, copies each secret from its pipe into
// its file on the secrets tmpfs (0600: umask 077 in a subshell, so the playbook keeps the
// image's umask), and replaces itself with ansible-playbook. The paths and the command come
// as arguments ($1, $2, the number of secrets, a pipe and a file per secret, then the
// command), never inside the script's text. A failed copy ends the container with 125 and
// cat's message in the job's output.
const runScript = `o=$1 e=$2 n=$3; shift 3; exec >"$o" 2>&1 3>"$e"; ` +
	`while [ "$n" -gt 0 ]; do (umask 077 && cat -- "$1" >"$2") || exit 125; shift 2; n=$((n-1)); done; ` +
	`exec "$@"`

// secretMount is the tmpfs in each job's container that holds its secret files.
const secretMount = "/run/rte-secrets"

func (d *dockerEngine) secretDir() string { return secretMount }

func (d *dockerEngine) start(ctx context.Context, l launch) (running, *os.File, *os.File, error) {
	// The container sees the job directory only: a playbook elsewhere (RTE_FILES=local, which
	// the settings refuse with docker) would not be there.
	if rel, err := filepath.Rel(l.jobDir, l.dir); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, nil, nil, fmt.Errorf("the job's container sees only the job directory, but the playbook's directory is %s: run containers with RTE_FILES=transfer", l.dir)
	}
	image := l.image
	if image == "" {
		image = d.cfg.Image
	}
	if err := d.pull(ctx, image); err != nil {
		return nil, nil, nil, err
	}
	// HOME is in the job directory: the host's means nothing in the image, and the job's own
	// is removed with it.
	home := filepath.Join(l.priv.dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("make the job's home directory: %v", err)
	}
	outPath, evPath := filepath.Join(l.priv.dir, "output.pipe"), filepath.Join(l.priv.dir, "events.pipe")
	p, err := openPipes(outPath, evPath)
	if err != nil {
		return nil, nil, nil, err
	}
	// Made before handOver, which gives them to the container's user with the rest.
	handoffs, err := makeSecretPipes(l.priv)
	if err != nil {
		p.closeAll()
		return nil, nil, nil, err
	}
	if err := d.handOver(l.jobDir); err != nil {
		p.closeAll()
		return nil, nil, nil, err
	}
	env := make([]string, 0, len(l.env)+1)
	for _, kv := range l.env {
		// The host's PATH means nothing in the image either: the image's own applies.
		if k, _, _ := splitEnv(kv); k == "PATH" || k == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home)

	yes := true
	entry := []string{"/bin/sh", "-c", runScript, "sh", outPath, evPath, strconv.Itoa(len(handoffs))}
	for _, h := range handoffs {
		entry = append(entry, h.pipe, h.file)
	}
	entry = append(append(entry, l.binary), l.args...)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dockerAPITimeout)
	defer cancel()
	userHome, err := d.homeIn(cctx, image)
	if err != nil {
		p.closeAll()
		return nil, nil, nil, err
	}
	created, err := d.cli.ContainerCreate(cctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:      image,
			User:       strconv.Itoa(d.uid) + ":" + strconv.Itoa(d.gid),
			Env:        env,
			Entrypoint: entry,
			WorkingDir: l.dir,
			Labels:     map[string]string{LabelName: d.cfg.Name, LabelJob: l.job},
		},
		HostConfig: &container.HostConfig{
			Init: &yes,
			// The job directory at the same path as on the RTE, so every path the runner
			// wrote (playbook, extravars, secret files, temp) means the same inside.
			Mounts:         []mount.Mount{{Type: mount.TypeBind, Source: l.jobDir, Target: l.jobDir}},
			NetworkMode:    container.NetworkMode(d.cfg.Network),
			SecurityOpt:    []string{"no-new-privileges"},
			CapDrop:        []string{"ALL"},
			ReadonlyRootfs: true,
			Tmpfs:          d.tmpfs(userHome),
			Resources:      d.resources(),
		},
	})
	if err != nil {
		p.closeAll()
		return nil, nil, nil, fmt.Errorf("create the job's container from %s: %v", image, err)
	}
	c := &dockerRun{d: d, id: created.ID, done: make(chan struct{}), keep: p.keep}
	if _, err := d.cli.ContainerStart(cctx, c.id, client.ContainerStartOptions{}); err != nil {
		c.remove()
		p.closeAll()
		return nil, nil, nil, fmt.Errorf("start the job's container from %s: %v", image, err)
	}
	if ins, err := d.cli.ContainerInspect(cctx, c.id, client.ContainerInspectOptions{}); err == nil && ins.Container.State != nil {
		c.hostPID = ins.Container.State.Pid
	}
	d.log.Info("job container started", zap.String("job", l.job), zap.String("image", image), zap.String("container", shortID(c.id)))
	if len(handoffs) > 0 {
		go c.handOverSecrets(handoffs)
	}
	return c, p.out, p.ev, nil
}

// resources are the container's limits. Swap is held to the memory limit (no swap beyond it),
// so RTE_JOB_MEMORY is the job's whole allowance, not half of it.
func (d *dockerEngine) resources() container.Resources {
	r := container.Resources{NanoCPUs: d.cfg.NanoCPUs, Memory: d.cfg.MemoryBytes}
	if d.cfg.MemoryBytes > 0 {
		r.MemorySwap = d.cfg.MemoryBytes
	}
	if d.cfg.Podman {
		r.Ulimits = podmanUlimits()
	}
	return r
}

// podmanUlimits are the open-file and process limits of a job's container under Podman.
// Without them Podman asks for its own defaults (a million open files), more than many
// machines grant its service, and the start fails with "error setting rlimits". Nor are the
// RTE's own limits a safe bound: the service may run with lower ones (here the RTE may have
// 96362 processes and the service 32768). podmanLimit, the usual soft limit of a Linux login,
// is granted everywhere and is plenty for ansible-playbook and its forks; an RTE whose own
// soft limit is lower passes that on instead. Docker applies its daemon's defaults and needs
// none.
func podmanUlimits() []*container.Ulimit {
	var out []*container.Ulimit
	for _, l := range []struct {
		name     string
		resource int
	}{{"nofile", unix.RLIMIT_NOFILE}, {"nproc", unix.RLIMIT_NPROC}} {
		n := int64(podmanLimit)
		var rl unix.Rlimit
		if err := unix.Getrlimit(l.resource, &rl); err == nil && rl.Cur < uint64(n) {
			n = int64(rl.Cur)
		}
		out = append(out, &container.Ulimit{Name: l.name, Soft: n, Hard: n})
	}
	return out
}

// podmanLimit is a job container's nofile and nproc limit under Podman (podmanUlimits).
const podmanLimit = 1024

// tmpfs are the container's writable places besides the job directory: /tmp, the secrets'
// directory, and the user's passwd home in the image (userHome, from homeIn; "" for none),
// where ansible keeps its temporary files (dockerhome.go says why).
func (d *dockerEngine) tmpfs(userHome string) map[string]string {
	t := map[string]string{"/tmp": "rw,nosuid,nodev,size=64m"}
	// The job's secrets: only the container's user may list or read them. Podman refuses
	// uid= and gid= (as below): a sticky world-writable directory in a container of one user,
	// the files themselves 0600 (runScript).
	t[secretMount] = fmt.Sprintf("rw,nosuid,nodev,noexec,size=1m,uid=%d,gid=%d,mode=0700", d.uid, d.gid)
	if d.cfg.Podman {
		t[secretMount] = "rw,nosuid,nodev,noexec,size=1m,mode=1777"
	}
	if userHome != "" && userHome != secretMount {
		t[userHome] = fmt.Sprintf("rw,nosuid,nodev,size=64m,uid=%d,gid=%d,mode=0700", d.uid, d.gid)
		if d.cfg.Podman {
			// Podman refuses uid= and gid= on a tmpfs; the container runs one user only, so
			// a sticky world-writable directory gives it the same.
			t[userHome] = "rw,nosuid,nodev,size=64m,mode=1777"
		}
	}
	return t
}

// pull fetches the image as RTE_PULL says.
func (d *dockerEngine) pull(ctx context.Context, image string) error {
	switch d.cfg.Pull {
	case PullNever:
		return nil
	case PullIfMissing:
		if _, err := d.cli.ImageInspect(ctx, image); err == nil {
			return nil
		}
	}
	resp, err := d.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err != nil {
		return fmt.Errorf("pull %s (RTE_PULL=%s): %w", image, d.cfg.Pull, err)
	}
	defer resp.Close()
	if err := resp.Wait(ctx); err != nil {
		return fmt.Errorf("pull %s (RTE_PULL=%s): %w", image, d.cfg.Pull, err)
	}
	return nil
}

// handOver gives the job directory to the container's user when the RTE runs as root, so the
// playbook can read its files and write its temp files without any right on the rest.
func (d *dockerEngine) handOver(dir string) error {
	if os.Getuid() != 0 {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, d.uid, d.gid); err != nil {
			return fmt.Errorf("hand the job directory to uid %d: %v", d.uid, err)
		}
		return nil
	})
}

// pipes are the read ends the runner gets, and write ends the RTE keeps open until the
// container has ended: a reader of a pipe nobody has opened for writing yet reads EOF, so
// without them the job's output would end before the container opened it.
type pipes struct {
	out, ev *os.File
	keep    []*os.File
}

func (p pipes) closeAll() {
	for _, f := range append([]*os.File{p.out, p.ev}, p.keep...) {
		if f != nil {
			f.Close()
		}
	}
}

func openPipes(outPath, evPath string) (pipes, error) {
	var p pipes
	for i, path := range []string{outPath, evPath} {
		if err := unix.Mkfifo(path, 0o600); err != nil {
			p.closeAll()
			return pipes{}, fmt.Errorf("make the pipe %s: %v", path, err)
		}
		// Non-blocking, so the open does not wait for a writer and reads go through Go's
		// poller (read deadlines work, as for os.Pipe).
		r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			p.closeAll()
			return pipes{}, fmt.Errorf("open the pipe %s: %v", path, err)
		}
		w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			r.Close()
			p.closeAll()
			return pipes{}, fmt.Errorf("open the pipe %s: %v", path, err)
		}
		p.keep = append(p.keep, w)
		if i == 0 {
			p.out = r
		} else {
			p.ev = r
		}
	}
	return p, nil
}

// dockerRun is one job's container.
type dockerRun struct {
	d       *dockerEngine
	id      string
	hostPID int
	done    chan struct{}
	keep    []*os.File

	mu       sync.Mutex // guards ended, signaled and st
	ended    bool
	signaled bool
	st       exitStatus
}

// pid is the host pid of the container's init, for the start record.
func (c *dockerRun) pid() int                { return c.hostPID }
func (c *dockerRun) exited() <-chan struct{} { return c.done }
func (c *dockerRun) what() string            { return "container" }

func (c *dockerRun) status() exitStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

func (c *dockerRun) wasSignaled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.signaled
}

// wait blocks until the container has stopped, then removes it (nothing of a job outlives it)
// and lets the pipes reach EOF.
func (c *dockerRun) wait() error {
	defer close(c.done)
	res := c.d.cli.ContainerWait(context.Background(), c.id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	var err error
	st := exitStatus{code: -1}
	select {
	case r := <-res.Result:
		st = exitStatus{known: true, code: int(r.StatusCode)}
		// docker-init, the container's pid 1, exits 128+n when a signal n ended the playbook.
		if n := r.StatusCode - 128; n > 0 && n < 65 {
			st.signal = syscall.Signal(n)
		}
		if r.Error != nil && r.Error.Message != "" {
			err = errors.New(r.Error.Message)
		}
	case err = <-res.Error:
		err = fmt.Errorf("wait for the job's container: %w", err)
	}
	if !st.known {
		// The engine lost track; kill it so it cannot run on unread.
		c.kill("SIGKILL")
	} else if c.oomKilled() {
		st.note = "the container reached its memory limit (RTE_JOB_MEMORY) and the kernel killed a process in it"
	}
	c.remove()
	c.mu.Lock()
	c.ended = true
	c.st = st
	c.mu.Unlock()
	for _, f := range c.keep {
		f.Close()
	}
	return err
}

// oomKilled reports whether the engine saw the kernel kill a process of the container for
// memory.
func (c *dockerRun) oomKilled() bool {
	ctx, cancel := context.WithTimeout(context.Background(), dockerAPITimeout)
	defer cancel()
	ins, err := c.d.cli.ContainerInspect(ctx, c.id, client.ContainerInspectOptions{})
	return err == nil && ins.Container.State != nil && ins.Container.State.OOMKilled
}

func (c *dockerRun) kill(sig string) {
	ctx, cancel := context.WithTimeout(context.Background(), dockerAPITimeout)
	defer cancel()
	_, _ = c.d.cli.ContainerKill(ctx, c.id, client.ContainerKillOptions{Signal: sig})
}

func (c *dockerRun) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), dockerAPITimeout)
	defer cancel()
	if _, err := c.d.cli.ContainerRemove(ctx, c.id, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
		c.d.log.Error("could not remove a job container; the next start removes it", zap.String("container", shortID(c.id)), zap.Error(err))
	}
}

func (c *dockerRun) signal(sig string) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.signaled = true
	c.mu.Unlock()
	c.kill(sig)
}

// stop sends the container SIGTERM (docker-init passes it to ansible-playbook), then SIGKILL
// if it has not stopped after grace.
func (c *dockerRun) stop(grace time.Duration) bool {
	c.signal("SIGTERM")
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return false
	case <-t.C:
	}
	c.signal("SIGKILL")
	return true
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// RemoveContainers removes every container labelled with cfg.Name (running ones are killed),
// and returns the job ids they were labelled with. An RTE calls it at start, before it empties
// its job directories: the containers of its previous start have nobody reading them. A
// container labelled with another name is never touched.
func RemoveContainers(ctx context.Context, cfg ContainerConfig) ([]string, error) {
	cli, err := newDockerClient(cfg.Host)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: make(client.Filters).Add("label", LabelName+"="+cfg.Name)})
	if err != nil {
		return nil, fmt.Errorf("list the containers left by the previous start: %w", err)
	}
	var jobs []string
	var problems []error
	for _, c := range list.Items {
		if c.Labels[LabelName] != cfg.Name {
			continue
		}
		if _, err := cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true}); err != nil && !cerrdefs.IsNotFound(err) {
			problems = append(problems, fmt.Errorf("remove container %s of job %s: %w", shortID(c.ID), c.Labels[LabelJob], err))
			continue
		}
		if job := c.Labels[LabelJob]; job != "" { // not homeIn's short-lived reader
			jobs = append(jobs, job)
		}
	}
	return jobs, errors.Join(problems...)
}
