package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/rte-project/rte/protocol"
)

// The config seed is a YAML file in which an operator declares runners with their credentials,
// instead of approving them one by one (docs/reference-app.md has the format):
//
//	runners:
//	  - name: rte01
//	    rte_mode: inbound            # inbound (the default), outbound or database
//	    url: https://rte01.example.com:8000
//	    token: ${RTE01_TOKEN}
//	    certificate_sha256: 9f1c04aa...   # optional: pin the first certificate that matches
//	    max_jobs: 0
//
// ${VAR} in a value is replaced by the environment variable VAR (one that is unset or empty is
// an error naming it), and $$ by one $. ApplySeed adds the runners that are missing, approved,
// and makes those that exist match the seed; either way they are marked Seeded. A runner the
// seed keeps in database mode is refused when its RTE signs in, until the seed moves it.

// Seed is a config seed as read from its file.
type Seed struct {
	Path    string // where it was read, for messages
	Runners []SeedRunner
}

// SeedRunner is one runner the seed declares.
type SeedRunner struct {
	Name              string
	Mode              string // protocol.ModeInbound, protocol.ModeOutbound or ModeDatabase
	URL               string // inbound only
	Token             string
	CertificateSHA256 string // inbound https:// only: 64 hex digits, lower case; may be ""
	MaxJobs           int
	Line              int // where its entry starts in the file
}

// SeedError lists every problem of a seed file, so the operator fixes them in one round.
type SeedError struct {
	Path     string
	Problems []string // each "line N: ...", never with a token's value
}

func (e *SeedError) Error() string {
	return fmt.Sprintf("config seed %s: %s", e.Path, strings.Join(e.Problems, "; "))
}

// LoadSeed reads and parses the seed file at path; lookup gives the environment (os.LookupEnv,
// or a test's table).
func LoadSeed(path string, lookup func(string) (string, bool)) (*Seed, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config seed: %w", err)
	}
	return ParseSeed(path, data, lookup)
}

// seedKeys are the keys of a runner's entry, in the order messages list them.
var seedKeys = []string{"name", "rte_mode", "url", "token", "certificate_sha256", "max_jobs"}

// ParseSeed parses a seed file's bytes, expanding ${VAR} from lookup, and checks every runner.
// Every problem is reported, in a *SeedError.
func ParseSeed(path string, data []byte, lookup func(string) (string, bool)) (*Seed, error) {
	seed := &Seed{Path: path}
	p := &SeedError{Path: path}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("not YAML: %s", protocol.PeerText(err.Error(), 300)))
		return nil, p
	}
	if len(bytes.TrimSpace(data)) == 0 || len(doc.Content) == 0 {
		p.Problems = append(p.Problems, "line 1: the seed is empty: declare the runners under runners:, or write runners: [] for none")
		return nil, p
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		p.Problems = append(p.Problems, fmt.Sprintf("line %d: the seed must be a mapping with the key runners:", top.Line))
		return nil, p
	}
	var list *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "runners":
			if list != nil {
				p.Problems = append(p.Problems, fmt.Sprintf("line %d: runners: is given twice", k.Line))
				continue
			}
			list = v
		default:
			p.Problems = append(p.Problems, fmt.Sprintf("line %d: unknown key %q: the seed holds runners: only", k.Line, protocol.PeerText(k.Value, 64)))
		}
	}
	switch {
	case list == nil:
		p.Problems = append(p.Problems, fmt.Sprintf("line %d: no runners: key: declare the runners under it, or write runners: [] for none", top.Line))
	case list.Kind == yaml.ScalarNode && list.Tag == "!!null":
	case list.Kind != yaml.SequenceNode:
		p.Problems = append(p.Problems, fmt.Sprintf("line %d: runners: must be a list of runners, each starting with - name: ...", list.Line))
	default:
		names := map[string]int{}
		for _, item := range list.Content {
			r, ok := parseSeedRunner(item, lookup, p)
			if !ok {
				continue
			}
			if first, dup := names[r.Name]; dup {
				p.Problems = append(p.Problems, fmt.Sprintf("line %d: runner %q is declared again (first at line %d): give each runner one entry", r.Line, r.Name, first))
				continue
			}
			names[r.Name] = r.Line
			seed.Runners = append(seed.Runners, r)
		}
	}
	if len(p.Problems) > 0 {
		return nil, p
	}
	return seed, nil
}

// parseSeedRunner reads one entry, adding its problems to p; ok is false when it has any.
func parseSeedRunner(item *yaml.Node, lookup func(string) (string, bool), p *SeedError) (r SeedRunner, ok bool) {
	r.Line = item.Line
	before := len(p.Problems)
	if item.Kind != yaml.MappingNode {
		p.Problems = append(p.Problems, fmt.Sprintf("line %d: a runner must be a mapping of %s", item.Line, strings.Join(seedKeys, ", ")))
		return r, false
	}
	vals := map[string]string{}
	lines := map[string]int{}
	bad := map[string]bool{} // keys already reported; their checks would only repeat it
	for i := 0; i+1 < len(item.Content); i += 2 {
		k, v := item.Content[i], item.Content[i+1]
		key := k.Value
		known := false
		for _, s := range seedKeys {
			known = known || s == key
		}
		switch {
		case !known:
			p.Problems = append(p.Problems, fmt.Sprintf("line %d: unknown key %q; a runner has %s", k.Line, protocol.PeerText(key, 64), strings.Join(seedKeys, ", ")))
			continue
		case lines[key] != 0:
			p.Problems = append(p.Problems, fmt.Sprintf("line %d: %s is given twice (first at line %d)", k.Line, key, lines[key]))
			continue
		case v.Kind != yaml.ScalarNode:
			p.Problems = append(p.Problems, fmt.Sprintf("line %d: %s must be a single value, not a list or a mapping", v.Line, key))
			bad[key] = true
			continue
		}
		lines[key] = k.Line
		raw := v.Value
		if v.Tag == "!!null" {
			raw = ""
		}
		val, err := expandVars(raw, lookup)
		if err != nil {
			p.Problems = append(p.Problems, fmt.Sprintf("line %d: %s: %v", v.Line, key, err))
			bad[key] = true
			continue
		}
		vals[key] = val
	}
	at := func(key string) int {
		if l := lines[key]; l != 0 {
			return l
		}
		return item.Line
	}
	add := func(key, format string, args ...any) {
		if bad[key] {
			return
		}
		who := ""
		if r.Name != "" {
			who = fmt.Sprintf("runner %q: ", r.Name)
		}
		p.Problems = append(p.Problems, fmt.Sprintf("line %d: %s%s", at(key), who, fmt.Sprintf(format, args...)))
	}

	r.Name = vals["name"]
	if _, given := lines["name"]; !given {
		add("name", "name is required")
	} else if err := checkName(r.Name); err != nil {
		r.Name = ""
		add("name", "%v", strings.Replace(err.Error(), "set RTE_NAME", "give the runner's RTE_NAME", 1))
	}
	r.Mode = strings.ToLower(strings.TrimSpace(vals["rte_mode"]))
	if r.Mode == "" {
		r.Mode = protocol.ModeInbound
	}
	switch r.Mode {
	case protocol.ModeInbound, protocol.ModeOutbound, ModeDatabase:
	default:
		add("rte_mode", "rte_mode %q is not inbound, outbound or database", protocol.PeerText(r.Mode, 64))
	}
	r.Token = vals["token"]
	switch {
	case r.Token == "":
		add("token", "token is required: the runner's RTE_TOKEN, best as ${VARIABLE} so the file holds no secret")
	case len(r.Token) < protocol.MinTokenLength:
		add("token", "token is %d characters, at least %d are required: give the runner's RTE_TOKEN", len(r.Token), protocol.MinTokenLength)
	case strings.IndexFunc(r.Token, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0:
		add("token", "token holds spaces or control characters; an RTE_TOKEN travels in an Authorization header")
	}
	r.URL = strings.TrimSpace(vals["url"])
	sha := strings.TrimSpace(vals["certificate_sha256"])
	if r.Mode == protocol.ModeInbound {
		if err := checkRunnerURL(r.URL); err != nil {
			add("url", "%s", strings.Replace(err.Error(), "set RTE_URL to", "give", 1))
		}
		if sha != "" {
			sum, err := protocol.ParseSHA256Fingerprint(sha)
			switch {
			case err != nil:
				add("certificate_sha256", "certificate_sha256: %v", err)
			case r.URL != "" && !isHTTPS(r.URL):
				add("certificate_sha256", "certificate_sha256 is given but url %s is not https://: give the runner's https:// address, or no fingerprint", r.URL)
			default:
				r.CertificateSHA256 = sum
			}
		}
	} else {
		if _, given := lines["url"]; given && r.URL != "" {
			add("url", "url is for inbound runners only: the app does not dial a runner in %s mode", r.Mode)
		}
		if _, given := lines["certificate_sha256"]; given && sha != "" {
			add("certificate_sha256", "certificate_sha256 is for inbound runners only: the app pins the certificate of the runners it dials")
		}
	}
	if v, given := vals["max_jobs"]; given && strings.TrimSpace(v) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			add("max_jobs", "max_jobs %q is not a whole number of at least 0 (0: the runner's own RTE_MAX_JOBS)", protocol.PeerText(v, 32))
		}
		r.MaxJobs = n
	}
	return r, len(p.Problems) == before
}

// expandVars replaces ${NAME} with the variable's value and $$ with $. A variable that is unset
// or empty is an error naming it: a seeded token must never silently be "".
func expandVars(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		s = s[i:]
		switch {
		case strings.HasPrefix(s, "$$"):
			b.WriteByte('$')
			s = s[2:]
		case strings.HasPrefix(s, "${"):
			end := strings.IndexByte(s, '}')
			if end < 0 {
				return "", errors.New("${ without a closing }: write ${VARIABLE}, or $$ for a literal $")
			}
			name := s[2:end]
			if !validVarName(name) {
				return "", fmt.Errorf("${%s} does not name a variable: use letters, digits and _, not starting with a digit", protocol.PeerText(name, 64))
			}
			v, ok := lookup(name)
			if !ok || v == "" {
				return "", fmt.Errorf("variable %s is not set (or empty): set it in the app's environment", name)
			}
			b.WriteString(v)
			s = s[end+1:]
		default:
			b.WriteByte('$')
			s = s[1:]
		}
	}
}

func validVarName(n string) bool {
	if n == "" {
		return false
	}
	for i, c := range n {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// seedState is the config seed as the App last applied it.
type seedState struct {
	mu   sync.Mutex
	path string
}

func (s *seedState) setPath(p string) {
	s.mu.Lock()
	s.path = p
	s.mu.Unlock()
}

func (s *seedState) getPath() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.path
}

// ApplySeed reads the config seed (Config.Seed) and brings the runners in line with it: a
// missing runner is added (AddRunner: approved, an inbound one pinning the first certificate
// that matches its certificate_sha256, or trusting the first it meets when none is given), and
// an existing one takes the seed's mode, address, token, fingerprint and max_jobs. Both are
// marked Seeded; a runner marked Seeded that the seed no longer lists is unmarked and stays.
// Every runner is tried, and every failure returned. Without a Config.Seed it does nothing.
func (a *App) ApplySeed(ctx context.Context) error {
	if a.cfg.Seed == nil {
		return nil
	}
	seed, err := a.cfg.Seed()
	if err != nil {
		return err
	}
	a.seed.setPath(seed.Path)
	declared := map[string]bool{}
	var errs []error
	for _, sr := range seed.Runners {
		declared[sr.Name] = true
		if err := a.applySeedRunner(ctx, seed.Path, sr); err != nil {
			errs = append(errs, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	runners, err := a.cfg.Store.ListRunners(ctx)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("config seed: list runners: %w", err))...)
	}
	for _, r := range runners {
		if !r.Seeded || declared[r.Name] {
			continue
		}
		r.Seeded = false
		if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("config seed: unmark runner %q: %w", r.Name, err))
			continue
		}
		a.log.Info("runner is no longer in the config seed; it stays, and is managed at the app from now on",
			zap.String("name", r.Name), zap.String("seed", seed.Path))
	}
	a.wakeRun()
	return errors.Join(errs...)
}

func (a *App) applySeedRunner(ctx context.Context, path string, sr SeedRunner) error {
	err := a.AddRunner(ctx, &Runner{Name: sr.Name, Mode: sr.Mode, URL: sr.URL, Token: sr.Token,
		CertificateSHA256: sr.CertificateSHA256, MaxJobs: sr.MaxJobs, Seeded: true})
	if err == nil || !errors.Is(err, ErrExists) {
		if err != nil {
			return fmt.Errorf("config seed %s line %d: %w", path, sr.Line, err)
		}
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.cfg.Store.GetRunner(ctx, sr.Name)
	if err != nil {
		return fmt.Errorf("config seed %s line %d: %w", path, sr.Line, err)
	}
	oldFP := r.TokenFingerprint
	changed := a.seedRunnerLocked(r, sr)
	if len(changed) == 0 && r.Seeded {
		return nil
	}
	r.Seeded = true
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return fmt.Errorf("config seed %s line %d: update runner %q: %w", path, sr.Line, sr.Name, err)
	}
	a.log.Info("runner follows the config seed",
		zap.String("name", r.Name), zap.String("seed", path), zap.Strings("changed", changed),
		zap.String("mode", r.Mode), zap.String("state", string(r.State)),
		zap.String("old_token_fingerprint", oldFP), zap.String("token_fingerprint", r.TokenFingerprint))
	return nil
}

// seedRunnerLocked makes r match the seed's entry and returns the names of what changed. A
// changed certificate is never accepted silently: a pin is only dropped (the first certificate
// matching the seed's fingerprint is pinned at the next dial), and a certificate waiting for
// approval is pinned only when it is the one the seed names. The caller holds a.mu and stores r.
func (a *App) seedRunnerLocked(r *Runner, sr SeedRunner) []string {
	var changed []string
	now := a.cfg.Now()
	if isRequest(r) {
		// Nobody approved this name yet; the seed is an admin's word, as AddRunner is.
		r.State, r.ApprovedAt = StateApproved, now
		changed = append(changed, "state")
		if r.PendingCertificate != nil && sr.CertificateSHA256 != "" && protocol.CertificateSHA256(r.PendingCertificate) == sr.CertificateSHA256 && equalSecret(r.Token, sr.Token) {
			r.Certificate = r.PendingCertificate
		}
		r.PendingCertificate = nil
	}
	if r.Mode != sr.Mode {
		r.Mode = sr.Mode
		changed = append(changed, "rte_mode")
	}
	if r.Mode != protocol.ModeInbound {
		sr.URL, sr.CertificateSHA256 = "", ""
		r.Certificate, r.PendingCertificate = nil, nil
	}
	if r.URL != sr.URL {
		r.URL = sr.URL
		changed = append(changed, "url")
		if !isHTTPS(r.URL) {
			r.Certificate, r.PendingCertificate = nil, nil
		}
	}
	if !equalSecret(r.Token, sr.Token) {
		r.Token, r.TokenFingerprint = sr.Token, protocol.TokenFingerprint(sr.Token)
		changed = append(changed, "token")
	}
	if r.CertificateSHA256 != sr.CertificateSHA256 {
		r.CertificateSHA256 = sr.CertificateSHA256
		changed = append(changed, "certificate_sha256")
		if sr.CertificateSHA256 != "" && r.Certificate != nil && protocol.CertificateSHA256(r.Certificate) != sr.CertificateSHA256 {
			r.Certificate = nil
		}
	}
	if sr.CertificateSHA256 != "" && r.PendingCertificate != nil && protocol.CertificateSHA256(r.PendingCertificate) == sr.CertificateSHA256 {
		r.Certificate, r.PendingCertificate = r.PendingCertificate, nil
		r.State = StateApproved
		changed = append(changed, "certificate")
	}
	if r.MaxJobs != sr.MaxJobs {
		r.MaxJobs = sr.MaxJobs
		changed = append(changed, "max_jobs")
	}
	if r.State == StateWaiting && r.PendingCertificate == nil {
		r.State = StateApproved // nothing left to approve
	}
	return changed
}

// leaveDatabaseModeLocked ends database mode for a runner whose RTE signed in over the
// outbound endpoint with the runner's own token: the token proves the RTE is that runner, so
// it becomes an outbound runner, approved, with nothing for an admin to do. A runner the config
// seed keeps in database mode is refused instead; the seed is read again first, so a seed
// edited since the app started counts. A non-nil answer is the refusal. The caller holds a.mu.
func (a *App) leaveDatabaseModeLocked(ctx context.Context, r *Runner) (*answer, error) {
	if r.Seeded && a.cfg.Seed != nil {
		seed, err := a.cfg.Seed()
		var entry *SeedRunner
		if err != nil {
			a.log.Warn("the config seed could not be read again for a runner it keeps in database mode; the runner stays as the seed last said",
				zap.String("name", r.Name), zap.Error(err))
		} else {
			a.seed.setPath(seed.Path)
			for i := range seed.Runners {
				if seed.Runners[i].Name == r.Name {
					entry = &seed.Runners[i]
				}
			}
		}
		switch {
		case err != nil:
		case entry == nil:
			r.Seeded = false // no longer the seed's: the RTE moves it as for any other runner
		case entry.Mode != ModeDatabase:
			changed := a.seedRunnerLocked(r, *entry)
			if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
				return nil, fmt.Errorf("apply the config seed to runner %q: %w", r.Name, err)
			}
			a.log.Info("runner follows the config seed, read again as its RTE signed in",
				zap.String("name", r.Name), zap.String("seed", seed.Path), zap.Strings("changed", changed), zap.String("mode", r.Mode))
			a.wakeRun()
			return nil, nil
		}
	}
	if r.Seeded {
		ans := refused(http.StatusForbidden, "runner '%s' is managed by the config seed in database mode: set rte_mode: outbound for it in the seed (%s), then restart this RTE", r.Name, a.seed.getPath())
		return &ans, nil
	}
	r.Mode = protocol.ModeOutbound
	r.URL, r.Certificate, r.PendingCertificate, r.CertificateSHA256 = "", nil, nil, ""
	if r.State != StateApproved {
		r.State, r.ApprovedAt = StateApproved, a.cfg.Now()
	}
	if err := a.cfg.Store.PutRunner(ctx, r); err != nil {
		return nil, fmt.Errorf("move runner %q from database mode to outbound: %w", r.Name, err)
	}
	a.log.Info(fmt.Sprintf("Runner '%s' moved from database mode to outbound: its RTE signed in with the runner's own token.", r.Name),
		zap.String("name", r.Name), zap.String("token_fingerprint", r.TokenFingerprint))
	return nil, nil
}
