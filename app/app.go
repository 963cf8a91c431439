package app

import (
	"context"
	"crypto/cipher"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/rte-project/rte/protocol"
)

// Defaults of Config.
const (
	// DefaultMaxWaiting bounds the registration requests waiting for an admin. Registration is
	// open to anyone who reaches the app, so without a bound a script could fill the runner
	// list; 20 is far more than an admin handles in a day.
	DefaultMaxWaiting = 20
	// DefaultMaxWaitingPerAddress bounds the requests waiting from one source address, so
	// that one caller cannot take every waiting slot and block every new RTE; a site whose
	// RTEs all reach the app through one proxy address raises it (at most MaxWaiting counts).
	DefaultMaxWaitingPerAddress = 5
	// DefaultWaitingTTL is how long a registration request waits for an admin before it is
	// dropped. An RTE registers again at every start, so a dropped request costs a restart.
	DefaultWaitingTTL = 24 * time.Hour
	// DefaultHelloTimeout bounds the wait for an RTE's hello after the upgrade. The RTE sends
	// hello at once; a peer that stays silent is not an RTE worth a goroutine.
	DefaultHelloTimeout = 10 * time.Second
	// DefaultQueueTimeout is how long a job waits for its runner (connected, with a free slot)
	// before it ends with status error; the reference app's RTE_QUEUE_MINUTES. An hour covers a
	// runner's restart or a busy afternoon; a job older than that is likely no longer wanted.
	DefaultQueueTimeout = 60 * time.Minute
	// DefaultPollInterval is how often Run looks for newly approved runners and for queued jobs
	// past QueueTimeout. Approve and AddRunner also wake Run at once.
	DefaultPollInterval = time.Second
	// DefaultRedialMin and DefaultRedialMax bound the jittered backoff between dials of a
	// runner that cannot be reached or whose socket dropped.
	DefaultRedialMin = time.Second
	DefaultRedialMax = 30 * time.Second
)

// maxNameBytes matches the protocol's bound on the hello's name.
const maxNameBytes = 128

// Config configures an App. Store and Node are required; zero values elsewhere take defaults.
type Config struct {
	Store  Store
	Logger *zap.Logger // nil logs nothing
	Node   string      // this app node's id, sent as X-App-Node and in welcome

	// JoinToken approves a registration that carries it at once (the RTE's RTE_JOIN_TOKEN).
	// Empty: every registration waits for an admin, and one carrying a join token is refused.
	JoinToken string

	MaxWaiting int // registration requests waiting at once; DefaultMaxWaiting when 0
	// MaxWaitingPerAddress: requests waiting at once from one source address (the host of
	// the request's remote address); DefaultMaxWaitingPerAddress when 0.
	MaxWaitingPerAddress int
	WaitingTTL           time.Duration // DefaultWaitingTTL when 0
	Now                  func() time.Time

	DialTimeout  time.Duration                         // connect, TLS and upgrade; the pinning default when 0
	HelloTimeout time.Duration                         // DefaultHelloTimeout when 0
	Proxy        func(*http.Request) (*url.URL, error) // for dialling runners; nil dials directly

	PingInterval, DeadAfter time.Duration // keepalive of each socket; the protocol's defaults when 0

	// QueueTimeout is how long a job may wait to be dispatched (runner full, not connected, or
	// refusing full or draining) before it ends with status error; DefaultQueueTimeout when 0.
	QueueTimeout time.Duration
	PollInterval time.Duration // DefaultPollInterval when 0
	RedialMin    time.Duration // DefaultRedialMin when 0
	RedialMax    time.Duration // DefaultRedialMax when 0

	// LeaseTTL is how long a runner's socket lease lasts without renewal when several app nodes
	// share the store (lease.go); the holder renews it every third of that. DefaultLeaseTTL
	// when 0.
	LeaseTTL time.Duration
	// LeasePoll is how often this node reads the leases: a job queued on another node reaches
	// a runner whose socket is here within about this. DefaultLeasePoll when 0.
	LeasePoll time.Duration

	// SecretKey, when set, seals job secrets in the store so that any app node sharing it can
	// dispatch the job (atrest.go); at least MinSecretKeyLength characters, the same on every
	// node. Empty: secrets stay in the memory of the node that took the submit.
	SecretKey string

	// Seed reads the config seed: the runners an operator declares in a file (seed.go). ApplySeed
	// calls it, and so does the outbound endpoint when a runner the seed kept in database mode
	// signs in, so that an edited seed counts without a restart of the app. Nil: no seed.
	Seed func() (*Seed, error)

	// Files packs and serves the bundles of jobs for runners that take their files from the
	// app (RTE_FILES=transfer). Nil: such runners get only jobs submitted with files, and
	// every bundle.want is answered bundle.missing.
	Files BundleSource

	// NoBundleFrames leaves the protocol feature bundle.frames out of welcome, so runners
	// fetch every changed bundle whole, as before the feature. For tests and for comparing;
	// the feature needs Files to implement BundleIndexer to save anything.
	NoBundleFrames bool
}

// App is the app half of protocol v1 for inbound and outbound runners: registration,
// approval, pinned dialling, the outbound endpoint, job dispatch and record storage. Its
// methods are safe for concurrent use.
type App struct {
	cfg Config
	log *zap.Logger

	// Lock order: mu (runners) and jobsMu (jobs) are never held together. Either may be held
	// while taking secretsMu, liveMu, watchMu or the leaseBook's and outbound's own locks; those
	// are leaves, nothing else is locked under them. Each mutex sits with what it guards.

	// mu serialises every read-modify-write of a runner, so an approval and a registration
	// for the same name cannot interleave and lose one of them. It is never held while dialling.
	mu sync.Mutex

	// jobsMu serialises every read-modify-write of a job (submit, dispatch, answers, records,
	// cancel, timeouts), so a cancel and an end record cannot interleave and lose one of them.
	// It is never held while waiting on a socket.
	jobsMu sync.Mutex

	// secretsMu guards secrets: job id -> name -> plaintext, kept only in memory and only until
	// the runner has the job (accepted, or listed in its hello) or the job ends.
	secretsMu sync.Mutex
	secrets   map[string]map[string]string

	liveMu sync.Mutex
	live   map[string]*live // connected runners by name, served on this node

	watchMu  sync.Mutex
	watchers map[string]map[*watcher]struct{} // Watch's callers by job id

	kick    chan struct{} // wakes Run's supervisor: a runner was approved or added
	running atomic.Bool   // Run was called

	out *outbound // sockets of outbound runners (outbound.go)

	leases *leaseBook  // which app node holds each runner's socket (lease.go)
	atRest cipher.AEAD // seals job secrets in the store; nil without Config.SecretKey (atrest.go)
	seed   seedState   // the config seed last applied (seed.go)

	checks checkWaiters // connection checks waiting for their check.result (check.go)
}

// New checks cfg and returns an App.
func New(cfg Config) (*App, error) {
	var problems []string
	if cfg.Store == nil {
		problems = append(problems, "Store is required")
	}
	if cfg.Node == "" {
		problems = append(problems, "Node is required: it names this app node to the runners (X-App-Node)")
	} else if strings.IndexFunc(cfg.Node, unicode.IsControl) >= 0 || len(cfg.Node) > maxNameBytes {
		problems = append(problems, fmt.Sprintf("Node %q must be 1 to %d printable characters", protocol.PeerText(cfg.Node, 64), maxNameBytes))
	}
	if cfg.JoinToken != "" && len(cfg.JoinToken) < protocol.MinTokenLength {
		problems = append(problems, fmt.Sprintf("JoinToken is %d characters; use at least %d so it cannot be guessed", len(cfg.JoinToken), protocol.MinTokenLength))
	}
	if cfg.MaxWaiting < 0 {
		problems = append(problems, fmt.Sprintf("MaxWaiting %d must not be negative", cfg.MaxWaiting))
	}
	if cfg.MaxWaitingPerAddress < 0 {
		problems = append(problems, fmt.Sprintf("MaxWaitingPerAddress %d must not be negative", cfg.MaxWaitingPerAddress))
	}
	if cfg.SecretKey != "" && len(cfg.SecretKey) < MinSecretKeyLength {
		problems = append(problems, fmt.Sprintf("SecretKey is %d characters; use at least %d, the same on every app node (openssl rand -hex 32)", len(cfg.SecretKey), MinSecretKeyLength))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"WaitingTTL", cfg.WaitingTTL}, {"DialTimeout", cfg.DialTimeout}, {"HelloTimeout", cfg.HelloTimeout},
		{"PingInterval", cfg.PingInterval}, {"DeadAfter", cfg.DeadAfter},
		{"QueueTimeout", cfg.QueueTimeout}, {"PollInterval", cfg.PollInterval},
		{"RedialMin", cfg.RedialMin}, {"RedialMax", cfg.RedialMax},
		{"LeaseTTL", cfg.LeaseTTL}, {"LeasePoll", cfg.LeasePoll},
	} {
		if d.v < 0 {
			problems = append(problems, fmt.Sprintf("%s %s must not be negative", d.name, d.v))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("app config: %s", strings.Join(problems, "; "))
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.MaxWaitingPerAddress == 0 {
		cfg.MaxWaitingPerAddress = DefaultMaxWaitingPerAddress
	}
	if cfg.WaitingTTL == 0 {
		cfg.WaitingTTL = DefaultWaitingTTL
	}
	if cfg.HelloTimeout == 0 {
		cfg.HelloTimeout = DefaultHelloTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = DefaultQueueTimeout
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.RedialMin == 0 {
		cfg.RedialMin = DefaultRedialMin
	}
	if cfg.RedialMax == 0 {
		cfg.RedialMax = DefaultRedialMax
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeasePoll == 0 {
		cfg.LeasePoll = DefaultLeasePoll
	}
	var atRest cipher.AEAD
	if cfg.SecretKey != "" {
		var err error
		if atRest, err = newAtRest(cfg.SecretKey); err != nil {
			return nil, fmt.Errorf("app config: SecretKey: %w", err)
		}
	}
	log := cfg.Logger.Named("app")
	return &App{
		cfg:      cfg,
		log:      log,
		kick:     make(chan struct{}, 1),
		secrets:  map[string]map[string]string{},
		live:     map[string]*live{},
		watchers: map[string]map[*watcher]struct{}{},
		out:      newOutbound(log),
		leases:   newLeaseBook(),
		atRest:   atRest,
	}, nil
}

// Handler serves the app's protocol endpoints: POST /api/v2/rte/register, and GET
// /api/v2/rte/socket where outbound runners open their socket. The sockets it takes are served
// until they end or Run returns; mount it on a server with header and read limits.
func (a *App) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(protocol.RegisterPath, a.serveRegister)
	mux.HandleFunc(protocol.OutboundSocketPath, a.serveOutbound)
	return mux
}

// ListRunners returns every runner in name order, after dropping registration requests that
// waited longer than WaitingTTL.
func (a *App) ListRunners(ctx context.Context) ([]*Runner, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.pruneLocked(ctx); err != nil {
		return nil, err
	}
	return a.cfg.Store.ListRunners(ctx)
}

// AddRunner adds a runner by hand or from the config seed, with no registration call: it is
// approved at once, since an admin wrote it down. Name and Token are required; Mode is inbound
// (the default), outbound, or ModeDatabase for a runner whose RTE has yet to leave database
// mode; an inbound runner needs an http:// or https:// URL. An https:// runner may come with its Certificate (DER) or its
// CertificateSHA256; with neither, the first certificate Connect meets waits for approval. State,
// TokenFingerprint, PendingCertificate and the times are set here; a taken name is ErrExists.
func (a *App) AddRunner(ctx context.Context, r *Runner) error {
	if r == nil {
		return errors.New("add runner: no runner given")
	}
	r = r.Clone()
	if err := checkName(r.Name); err != nil {
		return fmt.Errorf("add runner: %w", err)
	}
	if len(r.Token) < protocol.MinTokenLength {
		return fmt.Errorf("add runner %q: token is %d characters, at least %d are required: give the runner's RTE_TOKEN", r.Name, len(r.Token), protocol.MinTokenLength)
	}
	if r.Mode == "" {
		r.Mode = protocol.ModeInbound
	}
	switch r.Mode {
	case protocol.ModeInbound:
		if err := checkRunnerURL(r.URL); err != nil {
			return fmt.Errorf("add runner %q: %w", r.Name, err)
		}
	case protocol.ModeOutbound, ModeDatabase:
	default:
		return fmt.Errorf("add runner %q: mode %q is not %s, %s or %s", r.Name, protocol.PeerText(r.Mode, 64), protocol.ModeInbound, protocol.ModeOutbound, ModeDatabase)
	}
	if r.MaxJobs < 0 {
		return fmt.Errorf("add runner %q: max jobs %d must not be negative", r.Name, r.MaxJobs)
	}
	if r.CertificateSHA256 != "" {
		sum, err := protocol.ParseSHA256Fingerprint(r.CertificateSHA256)
		if err != nil {
			return fmt.Errorf("add runner %q: %w", r.Name, err)
		}
		r.CertificateSHA256 = sum
	}
	if r.Certificate != nil {
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return fmt.Errorf("add runner %q: certificate does not parse: %w", r.Name, err)
		}
		if r.CertificateSHA256 != "" && protocol.CertificateSHA256(r.Certificate) != r.CertificateSHA256 {
			return fmt.Errorf("add runner %q: the certificate's sha256 %s is not the fingerprint given (%s): give one of them, or the matching pair",
				r.Name, protocol.CertificateSHA256(r.Certificate), r.CertificateSHA256)
		}
	}
	if (r.Certificate != nil || r.CertificateSHA256 != "") && r.Mode == protocol.ModeInbound && !isHTTPS(r.URL) {
		return fmt.Errorf("add runner %q: a certificate is given but the url %s is not https://: use the runner's https:// address", r.Name, r.URL)
	}
	now := a.cfg.Now()
	r.State = StateApproved
	r.TokenFingerprint = protocol.TokenFingerprint(r.Token)
	r.PendingCertificate = nil
	r.RequestedAt, r.ApprovedAt = now, now

	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.cfg.Store.GetRunner(ctx, r.Name); err == nil {
		return fmt.Errorf("add runner %q: %w", r.Name, ErrExists)
	} else if !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("add runner %q: %w", r.Name, err)
	}
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return fmt.Errorf("add runner %q: %w", r.Name, err)
	}
	a.wakeRun()
	pin := "none: the first certificate met waits for approval"
	switch {
	case !isHTTPS(r.URL):
		pin = "none: plain http"
	case r.Certificate != nil:
		pin = "certificate " + protocol.CertificateFingerprint(r.Certificate)
	case r.CertificateSHA256 != "":
		pin = "sha256 " + r.CertificateSHA256
	}
	a.log.Info("runner added",
		zap.String("name", r.Name),
		zap.String("mode", r.Mode),
		zap.String("url", r.URL),
		zap.String("token_fingerprint", r.TokenFingerprint),
		zap.String("pin", pin))
	return nil
}

// pruneLocked drops registration requests that waited longer than WaitingTTL and returns the
// runners left. Only runners never approved are dropped: an approved runner whose certificate
// changed keeps waiting, since dropping it would silently forget an admin's decision.
func (a *App) pruneLocked(ctx context.Context) ([]*Runner, error) {
	all, err := a.cfg.Store.ListRunners(ctx)
	if err != nil {
		return nil, fmt.Errorf("list runners: %w", err)
	}
	now := a.cfg.Now()
	kept := all[:0]
	for _, r := range all {
		// An outbound runner waiting on its open socket is not a stale request: its RTE is
		// there, and would only join again at once.
		if isRequest(r) && now.Sub(r.RequestedAt) > a.cfg.WaitingTTL && !a.socketAnywhere(r.Name) {
			if err := a.cfg.Store.DeleteRunner(ctx, r.Name); err != nil && !errors.Is(err, ErrNotFound) {
				return nil, fmt.Errorf("drop expired request of runner %q: %w", r.Name, err)
			}
			a.log.Info("registration request dropped: no admin decided within the waiting time",
				zap.String("name", r.Name),
				zap.String("url", r.URL),
				zap.Time("requested_at", r.RequestedAt),
				zap.Duration("waiting_ttl", a.cfg.WaitingTTL))
			continue
		}
		kept = append(kept, r)
	}
	return kept, nil
}

// waitingFull says why one more registration request from remoteAddr is refused (429), or "".
// runners are the app's runners after pruning.
func (a *App) waitingFull(runners []*Runner, remoteAddr string) string {
	waiting, fromHere := 0, 0
	host := addressHost(remoteAddr)
	for _, r := range runners {
		if !isRequest(r) {
			continue
		}
		waiting++
		if addressHost(r.RemoteAddr) == host {
			fromHere++
		}
	}
	switch {
	case waiting >= a.cfg.MaxWaiting:
		return fmt.Sprintf("%d registration requests already wait for an admin: approve or reject them in the app, or wait until requests older than %s are dropped", waiting, a.cfg.WaitingTTL)
	case fromHere >= a.cfg.MaxWaitingPerAddress:
		return fmt.Sprintf("%d registration requests from this address already wait for an admin (at most %d per address): approve or reject them in the app, or have an admin clear waiting requests", fromHere, a.cfg.MaxWaitingPerAddress)
	}
	return ""
}

// addressHost is the host of a "host:port" remote address, or the address itself.
func addressHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// isRequest reports whether r is a registration request no admin has decided on yet.
func isRequest(r *Runner) bool { return r.State == StateWaiting && r.ApprovedAt.IsZero() }

func isHTTPS(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && strings.EqualFold(u.Scheme, "https")
}

// checkName accepts 1 to 128 bytes of printable UTF-8 without surrounding spaces: the name shows
// up in logs, the admin page and errors, where control characters would forge lines.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("name is required: set RTE_NAME")
	case len(name) > maxNameBytes:
		return fmt.Errorf("name is %d bytes, at most %d are allowed", len(name), maxNameBytes)
	case !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsControl) >= 0:
		return fmt.Errorf("name %q holds control characters or invalid UTF-8", protocol.PeerText(name, 64))
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("name %q starts or ends with a space", name)
	}
	return nil
}

// checkRunnerURL accepts an absolute http:// or https:// URL with a host and no credentials.
func checkRunnerURL(raw string) error {
	if raw == "" {
		return errors.New("url is required: set RTE_URL to the address the app dials")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q does not parse: set RTE_URL to an absolute https:// address", protocol.PeerText(raw, 200))
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return fmt.Errorf("url %q is not an absolute http:// or https:// URL: set RTE_URL to the address the app dials, such as https://rte01.example.com:8000", protocol.PeerText(raw, 200))
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("url %q has no host: set RTE_URL to the address the app dials", protocol.PeerText(raw, 200))
	}
	if u.User != nil {
		return fmt.Errorf("url %q carries credentials: remove them from RTE_URL, the token is the runner's credential", u.Redacted())
	}
	return nil
}

func fingerprintOrEmpty(der []byte) string {
	if der == nil {
		return ""
	}
	return protocol.CertificateFingerprint(der)
}
