package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/jobs/afevents"
	"github.com/rte-project/rte/protocol"
)

// Recorder is where records go: the spool satisfies it. Append assigns seq and returns once
// the record is durable. Append may keep data: the Manager never reuses a slice it passed.
type Recorder interface {
	Append(job, kind string, data json.RawMessage) (protocol.Record, error)
	// Has reports whether the job has records in the spool (running, or ended and not yet acked).
	Has(job string) bool
}

// Committer is a Recorder that can also append in two steps: write now, in order, and learn
// later that the record is durable. The Manager uses it for output and events, so a chatty
// job keeps reading its pipe while earlier records are being synced, and one sync covers many
// of its records instead of each record paying for its own.
type Committer interface {
	AppendAsync(job, kind string, data json.RawMessage) (Commit, error)
}

// Commit is one record written and waiting to be durable.
type Commit interface {
	Wait() (protocol.Record, error)
}

// maxUnsynced bounds the records a job may have written but not yet seen durable: enough for
// a sync of a few milliseconds to cover several 64 KiB batches, few enough that a failed sync
// stops the job within a few records.
const maxUnsynced = 32

// Defaults of Config.
const (
	DefaultAnsiblePlaybook = "ansible-playbook"
	DefaultKillGrace       = 10 * time.Second
	DefaultBatchBytes      = 64 << 10
	DefaultBatchInterval   = 100 * time.Millisecond

	// minBatchBytes keeps a batch able to hold any rune and any escaped secret.
	minBatchBytes = 1 << 10
)

// Config is what a Manager needs. Recorder, Files, Token, WorkDir and PluginDir are required.
type Config struct {
	Logger   *zap.Logger
	Recorder Recorder
	Files    Preparer
	// Token is RTE_TOKEN: it opens sealed secrets (protocol.OpenSecret).
	Token string
	// WorkDir holds job directories WorkDir/<job>, 0700, removed when the job ends. It is made
	// (0700) if missing.
	WorkDir string
	// PluginDir is the directory afevents.Install returned.
	PluginDir string
	// AnsiblePlaybook is the binary to run, looked up in PATH when it has no slash; default
	// "ansible-playbook".
	AnsiblePlaybook string
	// MaxJobs is RTE_MAX_JOBS: jobs at once; 0 means no limit.
	MaxJobs int
	// MaxOutputBytes is PROCESS_MAX_BUFFER: stdout and stderr bytes kept per job; the rest is
	// read and discarded. 0 means no limit.
	MaxOutputBytes int64
	// KillGrace is how long a process group has between SIGTERM and SIGKILL; default 10s.
	KillGrace time.Duration
	// Instance is the hostname, reported in each start record.
	Instance string
	// BaseEnv is the whole environment ansible starts from (the caller builds it with PassEnv
	// from RTE_JOB_ENV_ALLOW); nothing else of the RTE's environment reaches ansible.
	BaseEnv []string
	// EnvAllow is RTE_JOB_ENV_ALLOW: a guarded name (one that moves ansible's output, plugins
	// or configuration) listed here exactly may be set by a job's env. Optional.
	EnvAllow []string
	// BatchBytes bounds an output or events record; default 64 KiB, at least 1 KiB.
	BatchBytes int
	// BatchInterval is the longest a byte waits in a batch before it is appended; default 100ms.
	BatchInterval time.Duration
	// RanLedger is the file where the ids of ended jobs are kept for RanRetention, so that a
	// job.start replayed after its end was acknowledged is refused already_ran, also after a
	// restart. It must not be inside WorkDir (emptied at start). Empty: remembered in memory
	// only, until the Manager is gone.
	RanLedger string
	// Healthy reports the spool's health; while it returns an error, new jobs are refused.
	// Optional.
	Healthy func() error
	// Containers, when set, runs each job in its own container through the Docker Engine API
	// (RTE_ENGINE=docker, docker.go); nil runs each job as a process group on this host
	// (RTE_ENGINE=process, the default). AnsiblePlaybook is then looked up in the image, not
	// here.
	Containers *ContainerConfig
}

// Refusal is why Start did not take a job; it is what job.refused carries.
type Refusal struct {
	Code    string // one of protocol.Refused*
	Message string
}

func (r *Refusal) Error() string { return "job refused (" + r.Code + "): " + r.Message }

// RefusalCode is the job.refused code, for callers that see only an error (the session).
func (r *Refusal) RefusalCode() string { return r.Code }

func refuse(code, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Causes of a job's context: they decide the end status of a job whose process was signaled.
var (
	errCanceled  = errors.New("canceled by the app (job.cancel)")
	errTimeout   = errors.New("timeout")
	errAbandoned = errors.New("the RTE drained and RTE_DRAIN_SECONDS ran out")
)

// Manager runs jobs. It is safe for concurrent use.
type Manager struct {
	cfg      Config
	log      *zap.Logger
	binary   string // cfg.AnsiblePlaybook resolved to a path (process engine)
	engine   engine
	reserved []string // env keys a job may not set
	ran      *ledger
	changed  chan struct{}
	// givenUp is closed when a drain's grace has run out: a job whose end the spool has not
	// taken yet stops retrying it (the next start ends it abandoned from the spool).
	givenUp  chan struct{}
	giveUpMu sync.Once

	wg sync.WaitGroup // one per job goroutine

	mu       sync.Mutex
	jobs     map[string]*job
	maxJobs  int // the app's settings value; 0 means cfg.MaxJobs
	draining bool
}

// job is what the Manager keeps of an accepted job until its end is recorded.
type job struct {
	id      string
	js      *protocol.JobStart
	secrets map[string]string // name -> opened value
	ctx     context.Context
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed once the end is recorded and the directory removed
	// ended is set just before the end record is appended: from then on the job no longer
	// runs here, so Cancel says so even while the goroutine is still forgetting it.
	ended atomic.Bool
}

// New checks cfg, fills in defaults, makes WorkDir and finds the ansible-playbook binary.
func New(cfg Config) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	var problems []error
	if cfg.Recorder == nil {
		problems = append(problems, errors.New("jobs: Recorder is required"))
	}
	if cfg.Files == nil {
		problems = append(problems, errors.New("jobs: Files is required (LocalFiles for RTE_FILES=local)"))
	}
	if cfg.Token == "" {
		problems = append(problems, errors.New("jobs: Token (RTE_TOKEN) is required to open sealed secrets"))
	}
	if cfg.WorkDir == "" {
		problems = append(problems, errors.New("jobs: WorkDir is required"))
	}
	if cfg.PluginDir == "" {
		problems = append(problems, errors.New("jobs: PluginDir is required: install the af_events plugin with afevents.Install"))
	}
	if cfg.MaxJobs < 0 {
		problems = append(problems, fmt.Errorf("jobs: MaxJobs (RTE_MAX_JOBS) must not be negative, got %d", cfg.MaxJobs))
	}
	if cfg.MaxOutputBytes < 0 {
		problems = append(problems, fmt.Errorf("jobs: MaxOutputBytes (PROCESS_MAX_BUFFER) must not be negative, got %d", cfg.MaxOutputBytes))
	}
	if cfg.BatchBytes == 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	if cfg.BatchBytes < minBatchBytes {
		problems = append(problems, fmt.Errorf("jobs: BatchBytes must be at least %d, got %d", minBatchBytes, cfg.BatchBytes))
	}
	if cfg.BatchInterval <= 0 {
		cfg.BatchInterval = DefaultBatchInterval
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.AnsiblePlaybook == "" {
		cfg.AnsiblePlaybook = DefaultAnsiblePlaybook
	}
	binary := cfg.AnsiblePlaybook
	if cfg.Containers == nil {
		var err error
		if binary, err = exec.LookPath(cfg.AnsiblePlaybook); err != nil {
			problems = append(problems, fmt.Errorf("jobs: find %s: %w (install ansible-core)", cfg.AnsiblePlaybook, err))
		}
	} else if err := cfg.Containers.validate(); err != nil {
		problems = append(problems, fmt.Errorf("jobs: %w", err))
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	// ansible-playbook runs in the job's own working directory, so every path handed to it
	// (extravars and secret files) must be absolute.
	for _, p := range []*string{&cfg.WorkDir, &cfg.PluginDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("jobs: %s: %w", *p, err)
		}
		*p = abs
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("jobs: make work directory %s: %w", cfg.WorkDir, err)
	}
	ran, err := openLedger(cfg.RanLedger, cfg.Logger.Named("jobs"), time.Now)
	if err != nil {
		return nil, fmt.Errorf("jobs: %w", err)
	}
	var eng engine = processEngine{pluginPath: cfg.PluginDir}
	if cfg.Containers != nil {
		if eng, err = newDockerEngine(*cfg.Containers, cfg.PluginDir, cfg.Logger.Named("jobs")); err != nil {
			return nil, fmt.Errorf("jobs: %w", err)
		}
	}
	m := &Manager{
		engine:   eng,
		ran:      ran,
		cfg:      cfg,
		log:      cfg.Logger.Named("jobs"),
		binary:   binary,
		reserved: reservedEnv(cfg.PluginDir),
		changed:  make(chan struct{}, 1),
		givenUp:  make(chan struct{}),
		jobs:     make(map[string]*job),
	}
	return m, nil
}

// reservedEnv lists the env keys a job may not set: the plugin wiring, and the local temp
// directory that keeps ansible's files inside the job directory.
func reservedEnv(pluginDir string) []string {
	keys := []string{"ANSIBLE_LOCAL_TEMP", "ANSIBLE_CALLBACK_WHITELIST", "ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_PLUGINS", afevents.EnvFD, JobIDEnv}
	for _, kv := range afevents.Env(pluginDir, eventsFD) {
		if k, _, ok := splitEnv(kv); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// Start validates and launches a job and returns at once. It returns nil when the job is
// accepted, also for a job the RTE already has (running, or with records in the Recorder):
// such a job is never started twice. Otherwise it returns a *Refusal: full (RTE_MAX_JOBS
// reached, or the spool unhealthy), draining, or invalid (bad paths, env, or secrets that do
// not open, or anything the Preparer's Validate refuses).
func (m *Manager) Start(js *protocol.JobStart) error {
	if js == nil {
		return refuse(protocol.RefusedInvalid, "no job.start given")
	}
	if err := js.Validate(); err != nil {
		return refuse(protocol.RefusedInvalid, "%v", err)
	}
	if _, err := jobDir(m.cfg.WorkDir, js.Job); err != nil {
		return refuse(protocol.RefusedInvalid, "%v", err)
	}
	if r := m.ranBefore(js.Job); r != nil {
		return r
	}
	if m.known(js.Job) {
		return nil
	}
	secrets, err := m.check(js)
	if err != nil {
		return err
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.ranBefore(js.Job); r != nil {
		return r
	}
	if m.jobs[js.Job] != nil || m.cfg.Recorder.Has(js.Job) {
		return nil
	}
	if m.draining {
		return refuse(protocol.RefusedDraining, "the RTE is draining and takes no new jobs; send the job to another runner")
	}
	if m.cfg.Healthy != nil {
		if err := m.cfg.Healthy(); err != nil {
			return refuse(protocol.RefusedFull, "the RTE's spool is unhealthy, so it takes no new jobs until that is fixed: %v", err)
		}
	}
	if limit := m.maxLocked(); limit > 0 && len(m.jobs) >= limit {
		return refuse(protocol.RefusedFull, "%d of %d jobs running (RTE_MAX_JOBS or the runner page's value)", len(m.jobs), limit)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	j := &job{id: js.Job, js: js, secrets: secrets, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	if js.TimeoutS > 0 {
		var stop context.CancelFunc
		j.ctx, stop = context.WithTimeoutCause(ctx, time.Duration(js.TimeoutS)*time.Second, errTimeout)
		j.cancel = func(cause error) { cancel(cause); stop() }
	}
	m.jobs[js.Job] = j
	m.wg.Add(1)
	go m.run(j)
	m.notify()
	m.log.Info("job accepted", zap.String("job", js.Job), zap.String("playbook", js.Playbook))
	return nil
}

// known reports whether the job runs here or has records in the Recorder.
func (m *Manager) known(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.jobs[id] != nil || m.cfg.Recorder.Has(id)
}

// ranBefore refuses a job whose id already ran here and whose records the app has stored.
// While the ended job's records are still in the Recorder, a repeated start is the app
// catching up after a reconnect, and is accepted (nil) like any duplicate.
func (m *Manager) ranBefore(id string) *Refusal {
	at, ok := m.ran.ran(id)
	if !ok || m.cfg.Recorder.Has(id) {
		return nil
	}
	return refuse(protocol.RefusedAlreadyRan, "job %s already ran on this RTE (ended %s) and the app stored its records; a job id is used once: send a new id for a new run",
		id, at.UTC().Format(time.RFC3339))
}

// jobDir is the job's directory, WorkDir/<id>. It is the second wall behind
// protocol.ValidJobID: whatever the id, the Manager makes and removes only a strict child of
// WorkDir, never WorkDir itself, its parent or a sibling.
func jobDir(work, id string) (string, error) {
	dir := filepath.Join(work, id)
	if id == "" || filepath.Dir(dir) != work || filepath.Base(dir) != id {
		return "", fmt.Errorf("job: %q would not make a directory inside %s; use 1 to 128 of [A-Za-z0-9._-], not . or ..", protocol.PeerText(id, 64), work)
	}
	return dir, nil
}

// check does every validation that needs no lock and that protocol.JobStart.Validate (which
// Start ran first) cannot: env names the RTE reserves or guards, secrets, and the Preparer's own.
func (m *Manager) check(js *protocol.JobStart) (map[string]string, error) {
	if err := checkEnv(js.Env, m.reserved, m.cfg.EnvAllow); err != nil {
		return nil, refuse(protocol.RefusedInvalid, "%v", err)
	}
	if v, ok := m.cfg.Files.(Validator); ok {
		if err := v.Validate(js); err != nil {
			var r *Refusal
			if errors.As(err, &r) {
				return nil, r
			}
			return nil, refuse(protocol.RefusedInvalid, "%v", err)
		}
	}
	if err := m.checkImage(js.Image); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), engineCheckTimeout)
	defer cancel()
	if err := m.engine.ready(ctx, js.Image); err != nil {
		return nil, refuse(protocol.RefusedFull, "%v", err)
	}
	secrets := make(map[string]string, len(js.Secrets))
	for name, sealed := range js.Secrets {
		plain, err := protocol.OpenSecret(m.cfg.Token, js.Job, sealed)
		if err != nil {
			return nil, refuse(protocol.RefusedInvalid, "secrets.%s: %v", name, err)
		}
		secrets[name] = plain
	}
	return secrets, nil
}

// engineCheckTimeout bounds one question to the container engine (is it there, is the image):
// a daemon that does not answer in that time is as good as gone for a job.
const engineCheckTimeout = 5 * time.Second

// Ready reports whether the engine could start a job now: always nil for process groups; for
// containers, whether the engine answers and has the image it needs. Start refuses jobs "full"
// while it fails, and /ready shows its error.
func (m *Manager) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, engineCheckTimeout)
	defer cancel()
	return m.engine.ready(ctx, "")
}

// checkImage refuses a job naming an image this RTE does not run: any image when jobs run as
// processes, else one neither RTE_IMAGE nor RTE_IMAGES_ALLOW allows. The refusal comes before
// anything is made or pulled.
func (m *Manager) checkImage(image string) *Refusal {
	switch {
	case image == "":
		return nil
	case m.cfg.Containers == nil:
		return refuse(protocol.RefusedInvalid, "image: this RTE runs each job as a process on its host (RTE_ENGINE=process), not in an image; send the job without image, or to a runner whose hello lists %s", image)
	case !m.cfg.Containers.allows(image):
		return refuse(protocol.RefusedInvalid, "image: %s is not allowed on this RTE: it runs %s (RTE_IMAGES_ALLOW)", image, strings.Join(m.cfg.Containers.Images(), ", "))
	}
	return nil
}

// Images are the job images a job.start may name, for hello: RTE_IMAGE first, then
// RTE_IMAGES_ALLOW; nil when jobs run as processes.
func (m *Manager) Images() []string {
	if m.cfg.Containers == nil {
		return nil
	}
	return m.cfg.Containers.Images()
}

// Cancel signals the job's process group (SIGTERM, then SIGKILL after KillGrace); the job ends
// "canceled". It reports whether the job runs here. It does not wait.
func (m *Manager) Cancel(job string) bool {
	m.mu.Lock()
	j := m.jobs[job]
	m.mu.Unlock()
	if j == nil || j.ended.Load() {
		return false
	}
	j.cancel(errCanceled)
	return true
}

// SetMaxJobs applies the app's settings message; 0 means use Config.MaxJobs. Running jobs are
// never stopped: a lower value only refuses new jobs until enough have ended.
func (m *Manager) SetMaxJobs(n int) {
	if n < 0 {
		n = 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.maxJobs != n {
		m.maxJobs = n
		m.notify()
	}
}

// DefaultMaxJobs is Config.MaxJobs (RTE_MAX_JOBS): the limit when the app sets none, which
// hello and the registration report. The app's override never changes it.
func (m *Manager) DefaultMaxJobs() int { return m.cfg.MaxJobs }

func (m *Manager) maxLocked() int {
	if m.maxJobs > 0 {
		return m.maxJobs
	}
	return m.cfg.MaxJobs
}

// Capacity reports running jobs, the limit in force (0 = none) and whether the RTE drains.
func (m *Manager) Capacity() protocol.Capacity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return protocol.Capacity{Running: len(m.jobs), MaxJobs: m.maxLocked(), Draining: m.draining}
}

// Running lists the jobs accepted and not yet ended, sorted.
func (m *Manager) Running() []string {
	m.mu.Lock()
	ids := make([]string, 0, len(m.jobs))
	for id := range m.jobs {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	sort.Strings(ids)
	return ids
}

// Changed receives a value after any change of Capacity. Signals coalesce: one receive may
// stand for several changes, so read Capacity after it.
func (m *Manager) Changed() <-chan struct{} { return m.changed }

func (m *Manager) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Drain stops taking jobs (Start refuses "draining"), waits up to grace for running jobs to
// end, then stops the process groups of the rest (SIGTERM, SIGKILL after KillGrace), which end
// "abandoned"; a job whose end the spool has not taken yet stops waiting for it then. It
// returns nil once every job goroutine is done, or ctx's error if ctx ends first (the jobs
// still end on their own).
func (m *Manager) Drain(ctx context.Context, grace time.Duration) error {
	m.mu.Lock()
	if !m.draining {
		m.draining = true
		m.notify()
	}
	jobs := make([]*job, 0, len(m.jobs))
	for _, j := range m.jobs {
		jobs = append(jobs, j)
	}
	m.mu.Unlock()
	if len(jobs) == 0 {
		return nil
	}
	m.log.Info("draining", zap.Int("running", len(jobs)), zap.Duration("grace", grace))

	t := time.NewTimer(grace)
	defer t.Stop()
waitGrace:
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-t.C:
			break waitGrace
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.giveUpMu.Do(func() { close(m.givenUp) })
	for _, j := range jobs {
		select {
		case <-j.done:
		default:
			m.log.Warn("drain time ran out; stopping the job", zap.String("job", j.id))
			j.cancel(errAbandoned)
		}
	}
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Wait blocks until every job goroutine has returned. It does not stop jobs: call Drain first.
func (m *Manager) Wait() { m.wg.Wait() }

// Close releases the engine's connection (a container engine's API client). Call it after
// Wait; the Manager takes no job afterwards.
func (m *Manager) Close() error { return m.engine.close() }

// run is a job's goroutine: it runs the job, records its end, and forgets it.
func (m *Manager) run(j *job) {
	defer m.wg.Done()
	defer j.cancel(nil) // releases the timeout's timer
	r := newRunner(m, j)
	r.execute()

	m.mu.Lock()
	delete(m.jobs, j.id)
	m.notify()
	m.mu.Unlock()
	close(j.done)
}
