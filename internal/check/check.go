package check

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
	"golang.org/x/crypto/ssh"
)

// Defaults of Config.
const (
	// DefaultConcurrency bounds the connections of one check: a check of 1,000 hosts does not
	// open 1,000 sockets (and file descriptors) at once.
	DefaultConcurrency = 64
	// DefaultTimeout applies when a check's timeout_ms is 0.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxTimeout caps timeout_ms: a check holds connection slots until it ends, and an
	// app that asks for an hour most likely meant something else.
	DefaultMaxTimeout = 60 * time.Second
)

// MaxMessageBytes bounds an outcome's message. Messages carry host names, paths and text from
// the peer; a thousand outcomes of a few hundred bytes each still make a small check.result.
const MaxMessageBytes = 512

// Default ports and the one port that means plain HTTP for WinRM, as ansible decides it:
// ansible_winrm_scheme is http only when the port is 5985, and its default port is 5986.
const (
	defaultSSHPort   = 22
	defaultWinRMPort = 5986
	winrmHTTPPort    = 5985
)

// Config is what New needs. Zero values take the defaults named on each field.
type Config struct {
	// SSHDir is the ssh directory of the user the RTE runs as (default $HOME/.ssh). The
	// unencrypted private keys id_ed25519, id_ecdsa and id_rsa found there are offered, in that
	// order; the app never sends keys.
	SSHDir string
	// KnownHosts is the known_hosts file that decides which host keys are trusted (default
	// SSHDir/known_hosts). A missing file trusts no host; it is never written.
	KnownHosts string
	// Concurrency is how many targets are tried at once (default DefaultConcurrency), by all
	// the checks that run at the same time together: each try holds a socket, and the RTE's
	// jobs need file descriptors too.
	Concurrency int
	// DefaultTimeout applies when a check's timeout_ms is 0 (default DefaultTimeout).
	DefaultTimeout time.Duration
	// MaxTimeout caps a check's timeout_ms (default DefaultMaxTimeout).
	MaxTimeout time.Duration
	// WinRMRoots verifies the certificates of WinRM listeners on HTTPS (nil: the system roots).
	WinRMRoots *x509.CertPool
	// Logger receives warnings about unusable keys or known_hosts and a debug line per check
	// (default: none).
	Logger *zap.Logger
}

// Checker runs connection checks. It is safe for concurrent use; it holds no connection
// between checks.
type Checker struct {
	sshDir      string
	knownHosts  string
	concurrency int
	slots       chan struct{} // one token per try in progress, shared by concurrent checks
	defTimeout  time.Duration
	maxTimeout  time.Duration
	roots       *x509.CertPool
	log         *zap.Logger
	localUser   string // the SSH user of targets that name none
	dialer      net.Dialer
	probeKey    ssh.PublicKey // a key in no known_hosts file: asking for it lists a host's keys
	winrmHTTP   int           // the WinRM port that means plain HTTP; tests move it

	warnMu sync.Mutex
	warned map[string]bool // warnings already logged, so a check every few seconds does not repeat them
}

// New validates cfg and returns a Checker. It reads no key yet: every check reads the files
// afresh.
func New(cfg Config) (*Checker, error) {
	var errs []error
	if cfg.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency must not be negative, got %d", cfg.Concurrency))
	}
	if cfg.DefaultTimeout < 0 {
		errs = append(errs, fmt.Errorf("default timeout must not be negative, got %s", cfg.DefaultTimeout))
	}
	if cfg.MaxTimeout < 0 {
		errs = append(errs, fmt.Errorf("max timeout must not be negative, got %s", cfg.MaxTimeout))
	}
	ch := &Checker{
		sshDir:      cfg.SSHDir,
		knownHosts:  cfg.KnownHosts,
		concurrency: cfg.Concurrency,
		defTimeout:  cfg.DefaultTimeout,
		maxTimeout:  cfg.MaxTimeout,
		roots:       cfg.WinRMRoots,
		log:         cfg.Logger,
		winrmHTTP:   winrmHTTPPort,
		warned:      make(map[string]bool),
		// No keep-alive: a check's connection lives for one handshake.
		dialer: net.Dialer{KeepAlive: -1},
	}
	if ch.log == nil {
		ch.log = zap.NewNop()
	}
	if ch.concurrency == 0 {
		ch.concurrency = DefaultConcurrency
	}
	if ch.defTimeout == 0 {
		ch.defTimeout = DefaultTimeout
	}
	if ch.maxTimeout == 0 {
		ch.maxTimeout = DefaultMaxTimeout
	}
	if ch.defTimeout > ch.maxTimeout {
		errs = append(errs, fmt.Errorf("default timeout %s is longer than max timeout %s", ch.defTimeout, ch.maxTimeout))
	}
	if ch.sshDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			errs = append(errs, fmt.Errorf("ssh dir: not set and no home directory to default to: %w", err))
		}
		ch.sshDir = filepath.Join(home, ".ssh")
	}
	if ch.knownHosts == "" {
		ch.knownHosts = filepath.Join(ch.sshDir, "known_hosts")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("check config: %w", err)
	}
	ch.log = ch.log.Named("check")
	ch.slots = make(chan struct{}, ch.concurrency)

	ch.localUser = os.Getenv("USER")
	if u, err := user.Current(); err == nil {
		ch.localUser = u.Username
	} else if ch.localUser == "" {
		// Not fatal: only SSH targets that name no user need it, and their outcome says so.
		ch.log.Warn("the RTE's user name is unknown; ssh targets without a user will fail", zap.Error(err))
	}

	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate known_hosts probe key: %w", err)
	}
	if ch.probeKey, err = ssh.NewPublicKey(pub); err != nil {
		return nil, fmt.Errorf("generate known_hosts probe key: %w", err)
	}
	return ch, nil
}

// Run tries every target of c once and returns one outcome per target, in the order of
// c.Targets. At most Config.Concurrency targets are tried at once, counting those of other
// checks running at the same time. Run returns once every target has an outcome, which is
// within c.TimeoutMS (0: Config.DefaultTimeout; capped at Config.MaxTimeout) of the call, or
// sooner when ctx ends: a target still connecting at the deadline, or never started because
// every slot was busy until then, is "timeout". Keys and known_hosts are read once per call.
// Run may be called concurrently.
func (ch *Checker) Run(ctx context.Context, c *protocol.Check) protocol.CheckResult {
	res := protocol.CheckResult{ID: c.ID, Results: make([]protocol.CheckOutcome, len(c.Targets))}
	b := ch.newBatch(c.TimeoutMS)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	// A fixed pool takes the next index as a slot frees up: the targets are tried in order,
	// and those left when the deadline comes are answered at once, without a goroutine each.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(ch.concurrency, len(c.Targets)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(c.Targets) {
					return
				}
				select {
				case ch.slots <- struct{}{}:
					res.Results[i] = ch.one(ctx, b, c.Targets[i])
					<-ch.slots
				case <-ctx.Done():
					res.Results[i] = ch.one(ctx, b, c.Targets[i]) // "not tried"
				}
			}
		})
	}
	wg.Wait()

	if ce := ch.log.Check(zap.DebugLevel, "check done"); ce != nil {
		counts := make(map[string]int)
		for _, o := range res.Results {
			counts[o.Status]++
		}
		ce.Write(zap.String("id", c.ID), zap.Int("targets", len(c.Targets)), zap.Any("statuses", counts))
	}
	return res
}

// batch is what the targets of one check share: the timeout, and the keys and known_hosts read
// for this check (only if it has an SSH target).
type batch struct {
	timeout time.Duration
	ssh     func() *sshFiles
}

func (ch *Checker) newBatch(timeoutMS int) *batch {
	b := &batch{timeout: ch.defTimeout}
	switch {
	case int64(timeoutMS) > ch.maxTimeout.Milliseconds():
		b.timeout = ch.maxTimeout // compared in ms: a huge timeout_ms would overflow a Duration
	case timeoutMS > 0:
		b.timeout = time.Duration(timeoutMS) * time.Millisecond
	}
	b.ssh = sync.OnceValue(ch.loadSSHFiles)
	return b
}

// result is a target's outcome before its latency is known.
type result struct {
	status  string
	message string
}

func (ch *Checker) one(ctx context.Context, b *batch, t protocol.CheckTarget) protocol.CheckOutcome {
	start := time.Now()
	var r result
	// The clock, not only ctx: the connection deadlines of the targets before this one end a
	// moment before ctx's own timer marks it done.
	deadline, _ := ctx.Deadline()
	switch {
	case ctx.Err() != nil || !start.Before(deadline):
		r = notTried(ctx, b)
	case t.Transport == protocol.TransportSSH:
		r = ch.checkSSH(ctx, b, t)
	case t.Transport == protocol.TransportWinRM:
		r = ch.checkWinRM(ctx, b, t)
	default:
		r = result{protocol.CheckUnreachable, fmt.Sprintf("transport %q is not supported: use ssh or winrm", t.Transport)}
	}
	return protocol.CheckOutcome{
		Name:      t.Name,
		Host:      t.Host,
		Status:    r.status,
		Message:   bound(r.message),
		LatencyMS: time.Since(start).Milliseconds(),
	}
}

func notTried(ctx context.Context, b *batch) result {
	if errors.Is(ctx.Err(), context.Canceled) {
		return result{protocol.CheckTimeout, "not tried: the check was cancelled, most likely because the RTE is stopping"}
	}
	return result{protocol.CheckTimeout, fmt.Sprintf("not tried: the check's %d ms ran out while every connection slot was busy (with this or other checks); check fewer hosts at once or allow more time", b.timeout.Milliseconds())}
}

// endpoint is where a target is dialed and how it is named in messages.
type endpoint struct {
	host string // without brackets
	port int
	addr string // host:port, [v6]:port
}

func newEndpoint(t protocol.CheckTarget, defPort int) endpoint {
	e := endpoint{host: strings.TrimSuffix(strings.TrimPrefix(t.Host, "["), "]"), port: t.Port}
	if e.port == 0 {
		e.port = defPort
	}
	e.addr = net.JoinHostPort(e.host, fmt.Sprint(e.port))
	return e
}

// dial opens a TCP connection whose every read and write ends by ctx's deadline, and whose
// stop function must be called (before Close) once the caller is done with it.
func (ch *Checker) dial(ctx context.Context, b *batch, e endpoint) (net.Conn, func() bool, *result) {
	conn, err := ch.dialer.DialContext(ctx, "tcp", e.addr)
	if err != nil {
		r := dialFailure(ctx, b, e, err)
		return nil, nil, &r
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline) // cannot fail on a fresh TCP connection
	// A cancelled ctx (the RTE stopping) ends a handshake at once rather than at the deadline.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	return conn, stop, nil
}

// dialFailure turns a failed TCP connect into an outcome.
func dialFailure(ctx context.Context, b *batch, e endpoint, err error) result {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return result{protocol.CheckUnreachable, fmt.Sprintf("connection to %s refused: nothing listens on that port, or a firewall rejects the connection", e.addr)}
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return result{protocol.CheckUnreachable, fmt.Sprintf("no route to %s: check the address and the network path from the RTE", e.addr)}
	case errors.Is(ctx.Err(), context.Canceled):
		return result{protocol.CheckTimeout, fmt.Sprintf("the check was cancelled while connecting to %s, most likely because the RTE is stopping", e.addr)}
	case ctx.Err() != nil || isTimeout(err):
		return result{protocol.CheckTimeout, fmt.Sprintf("no TCP connection to %s within %d ms: the host is down, or a firewall drops the traffic", e.addr, b.timeout.Milliseconds())}
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return result{protocol.CheckUnreachable, fmt.Sprintf("cannot resolve host name %q: no such host; check the name and the RTE's DNS", e.host)}
	case errors.As(err, &dnsErr):
		return result{protocol.CheckUnreachable, fmt.Sprintf("cannot resolve host name %q (%s): check the RTE's DNS", e.host, dnsErr.Err)}
	default:
		return result{protocol.CheckUnreachable, fmt.Sprintf("cannot connect to %s: %v", e.addr, err)}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// bound makes s one line of at most MaxMessageBytes: control characters (from a peer's error
// text, or a host name the app sent) become spaces, and a long tail becomes "...".
func bound(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return ' '
		}
		return r
	}, s)
	if len(s) <= MaxMessageBytes {
		return s
	}
	cut := MaxMessageBytes - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// warnOnce logs a warning the first time key is seen. Keys include what the warning is about
// (a file's path and modification time), so a changed file is reported again.
func (ch *Checker) warnOnce(key, msg string, fields ...zap.Field) {
	ch.warnMu.Lock()
	if len(ch.warned) > 1000 {
		clear(ch.warned) // files that change all the time: repeat a warning rather than grow
	}
	seen := ch.warned[key]
	ch.warned[key] = true
	ch.warnMu.Unlock()
	if !seen {
		ch.log.Warn(msg, fields...)
	}
}
