package config

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Settings is the RTE's configuration, one field per environment variable (docs/settings.md
// is the reference). Load fills and checks it; treat it as read-only afterwards. A variable
// set to the empty string counts as unset.
type Settings struct {
	// Mode is protocol.ModeInbound (the app dials this RTE) or protocol.ModeOutbound (this RTE
	// dials APP_URL), in lower case.
	Mode string `env:"RTE_MODE" envDefault:"inbound"`

	// Port and ListenHost are where the RTE listens: socket and probes inbound, probes only
	// outbound. An empty ListenHost means every address.
	Port       int    `env:"PORT" envDefault:"8000"`
	ListenHost string `env:"LISTEN_HOST"`

	// HTTPS turns on TLS for the listener with the pair in HTTPSKey and HTTPSCert; the
	// certificate code generates a self-signed pair there when the files are missing.
	HTTPS     bool   `env:"HTTPS" envDefault:"0"`
	HTTPSKey  string `env:"HTTPS_KEY" envDefault:"certificates/key.pem"`
	HTTPSCert string `env:"HTTPS_CERT" envDefault:"certificates/cert.pem"`

	// Token authenticates both directions of the socket and keys the sealed job secrets.
	// Always set, at least protocol.MinTokenLength characters.
	Token Secret `env:"RTE_TOKEN"`

	// Name is the runner's name at the app; Load fills in rte-<hostname>-<port> when unset.
	Name string `env:"RTE_NAME"`

	// AppURL is where an outbound RTE dials and an inbound one registers; RTEURL is where the
	// app dials an inbound RTE. Both are absolute http(s) URLs without a trailing slash, or
	// empty.
	AppURL string `env:"APP_URL"`
	RTEURL string `env:"RTE_URL"`

	// JoinToken, when set, approves the runner at once on its first join.
	JoinToken Secret `env:"RTE_JOIN_TOKEN"`

	// AppTLSVerify false skips verification of the app's certificate; Warnings says so at
	// every start. ExtraCACerts is a PEM file of CAs trusted for the app besides the system's.
	AppTLSVerify bool   `env:"APP_TLS_VERIFY" envDefault:"1"`
	ExtraCACerts string `env:"NODE_EXTRA_CA_CERTS"`

	// HTTPSProxy is the proxy for connections to the app, normalised to a URL with scheme
	// http or socks5; it may carry credentials, hence Secret. NoProxy is the usual
	// comma-separated list of hosts reached directly. Each falls back to its lower-case
	// spelling (https_proxy, no_proxy) when unset.
	HTTPSProxy Secret `env:"HTTPS_PROXY"`
	NoProxy    string `env:"NO_PROXY"`

	// MaxJobs is how many playbooks run at once, 0 for no limit; the app may override it.
	MaxJobs int `env:"RTE_MAX_JOBS" envDefault:"10"`

	// DrainSeconds is how long running jobs may finish after SIGTERM before they are
	// cancelled; see DrainTimeout.
	DrainSeconds int `env:"RTE_DRAIN_SECONDS" envDefault:"25"`

	SpoolPath string `env:"RTE_SPOOL_PATH" envDefault:"spool"`

	// Files is protocol.FilesTransfer (the app sends content bundles, cached under CachePath
	// up to CacheMB MiB) or protocol.FilesLocal (playbooks under AnsiblePath, inventories
	// under RepoPath, both then set).
	Files       string `env:"RTE_FILES" envDefault:"transfer"`
	CachePath   string `env:"RTE_CACHE_PATH" envDefault:"cache"`
	CacheMB     int    `env:"RTE_CACHE_MB" envDefault:"1024"`
	AnsiblePath string `env:"ANSIBLE_PATH"`
	RepoPath    string `env:"REPO_PATH"`

	// MetricsToken guards /metrics; when unset /metrics answers 404.
	MetricsToken Secret `env:"METRICS_TOKEN"`

	// LogLevel is debug, info, warn or error; LogFormat is json or console. Both lower case.
	LogLevel  string `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat string `env:"LOG_FORMAT" envDefault:"json"`

	// Advanced settings (docs/settings.md says when to touch them).

	// ProcessMaxBuffer is the bytes of output kept per job; output beyond it is cut.
	ProcessMaxBuffer int64 `env:"PROCESS_MAX_BUFFER" envDefault:"104857600"`

	// PingInterval and DeadAfter are the socket keepalive: a ping every PingInterval, and a
	// socket on which nothing arrived for DeadAfter is dead. DeadAfter > PingInterval.
	PingInterval time.Duration `env:"RTE_PING_INTERVAL" envDefault:"15s"`
	DeadAfter    time.Duration `env:"RTE_DEAD_AFTER" envDefault:"45s"`

	// WorkPath is where each job's private directory is made.
	WorkPath string `env:"RTE_WORK_PATH" envDefault:"jobs"`

	// Engine is how each job runs: process (a process group under the RTE's user, the
	// default), docker or podman (a container per job through the Docker Engine API, or
	// Podman's Docker-compatible one, at EngineHost, from Image; docs/engines.md).
	Engine string `env:"RTE_ENGINE" envDefault:"process"`
	Image  string `env:"RTE_IMAGE"`
	// ImagesAllow is RTE_IMAGES_ALLOW: the other images a job.start may name, exact
	// references or patterns where * stands for any characters but "/". Read it with
	// ImagesAllowList.
	ImagesAllow string `env:"RTE_IMAGES_ALLOW"`
	// EngineHost is the engine's API; empty is the engine's usual socket (EngineHost fills
	// it in at check).
	EngineHost string `env:"RTE_ENGINE_HOST"`
	// Pull is never, if-missing or always; never suits a DMZ without a registry.
	Pull string `env:"RTE_PULL" envDefault:"never"`
	// JobNetwork is the network each job's container joins; none cuts it off.
	JobNetwork string `env:"RTE_JOB_NETWORK" envDefault:"bridge"`
	// JobCPUs (a decimal number of CPUs) and JobMemory (bytes with an optional k, m or g)
	// limit each job's container; empty sets no limit. Read them with JobNanoCPUs and
	// JobMemoryBytes.
	JobCPUs   string `env:"RTE_JOB_CPUS"`
	JobMemory string `env:"RTE_JOB_MEMORY"`

	// JobEnvAllow is RTE_JOB_ENV_ALLOW: the names, and NAME_* prefix patterns, of the RTE's
	// own environment variables passed into each job; everything else of the RTE's environment
	// (its tokens, proxies for the app) never reaches ansible. A name listed exactly also lets
	// the app set that name in job.start env even where the RTE would otherwise refuse it
	// (jobs.GuardedEnv). Read it with JobEnvAllowList.
	JobEnvAllow string `env:"RTE_JOB_ENV_ALLOW" envDefault:"PATH,HOME,USER,LOGNAME,SHELL,LANG,LANGUAGE,TZ,TMPDIR,SSH_AUTH_SOCK,LC_*,ANSIBLE_*"`

	// CacheStaleAfter is how long an RTE sharing RTE_CACHE_PATH may go without a heartbeat
	// before another RTE removes its directory there (its half-received bundles and job
	// directories). Tests shorten it; operators have no reason to.
	CacheStaleAfter time.Duration `env:"RTE_CACHE_STALE_AFTER" envDefault:"10m"`

	// proxyFrom and noProxyFrom name the variable the value came from, for Effective.
	proxyFrom, noProxyFrom string
	// written holds the values that did not parse, as the operator wrote them, for Effective
	// to show instead of the zero value left behind ("abc", not "0", which reads as no limit).
	written map[string]string
	// refused names every variable with a problem: Warnings says nothing about the effect of
	// a value that is not used.
	refused map[string]bool
}

// Load reads the settings from environ ("K=V" strings, as os.Environ gives) and checks them.
// It never reads the process environment itself, so a test can hand it a table. hostname feeds
// the default RTE_NAME. When any setting is bad the error is a *Problems listing all of them,
// and the Settings returned beside it are filled as far as parsing got, for `rte check-config`
// to show; nothing may start from them.
func Load(environ []string, hostname string) (*Settings, error) {
	vars := env.ToMap(environ)
	s := &Settings{}
	p := &Problems{}
	// failed holds the variables whose value could not be parsed, so that the checks below
	// do not report the zero value left behind as a second problem.
	failed := map[string]bool{}

	// Options.Environment replaces the process environment wholesale: nothing of os.Environ
	// reaches s.
	err := env.ParseWithOptions(s, env.Options{Environment: vars, FuncMap: parsers})
	if err != nil {
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			return nil, fmt.Errorf("parse settings: %w", err)
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if !errors.As(e, &pe) {
				return nil, fmt.Errorf("parse settings: %w", e)
			}
			f := fieldByName[pe.Name]
			failed[f.Var] = true
			if s.written == nil {
				s.written = map[string]string{}
			}
			s.written[f.Var] = vars[f.Var]
			p.Add(f.Var, "%v; the default is %s", pe.Err, f.Default)
		}
	}

	s.proxyFrom, s.noProxyFrom = "HTTPS_PROXY", "NO_PROXY"
	if s.HTTPSProxy == "" && vars["https_proxy"] != "" {
		s.HTTPSProxy, s.proxyFrom = Secret(vars["https_proxy"]), "https_proxy"
	}
	if s.NoProxy == "" && vars["no_proxy"] != "" {
		s.NoProxy, s.noProxyFrom = vars["no_proxy"], "no_proxy"
	}

	s.check(p, vars, hostname, failed)
	if len(p.List) > 0 {
		s.refused = map[string]bool{}
		for _, pr := range p.List {
			s.refused[pr.Var] = true
		}
		sortProblems(p.List)
		return s, p
	}
	return s, nil
}

// ListenAddr is the address to listen on, as net.Listen wants it.
func (s *Settings) ListenAddr() string {
	return net.JoinHostPort(s.ListenHost, strconv.Itoa(s.Port))
}

// DrainTimeout is RTE_DRAIN_SECONDS as a duration.
func (s *Settings) DrainTimeout() time.Duration {
	return time.Duration(s.DrainSeconds) * time.Second
}

// JobEnvAllowList is RTE_JOB_ENV_ALLOW split at commas, spaces trimmed, empty entries dropped.
func (s *Settings) JobEnvAllowList() []string {
	var out []string
	for _, e := range strings.Split(s.JobEnvAllow, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// CacheBytes is RTE_CACHE_MB in bytes (MiB, 1 MiB = 1048576 bytes).
func (s *Settings) CacheBytes() int64 { return int64(s.CacheMB) << 20 }

// field describes one settings variable, read from Settings' tags once, so that problem
// ordering, parse errors and Effective cannot drift from the struct.
type field struct {
	Name    string // Go field name
	Var     string // environment variable
	Default string // envDefault, "" when none
	Index   int
}

var fields, fieldByName = settingsFields()

func settingsFields() ([]field, map[string]field) {
	t := reflect.TypeFor[Settings]()
	var list []field
	byName := map[string]field{}
	for i := range t.NumField() {
		sf := t.Field(i)
		v := sf.Tag.Get("env")
		if v == "" {
			continue
		}
		f := field{Name: sf.Name, Var: v, Default: sf.Tag.Get("envDefault"), Index: i}
		list = append(list, f)
		byName[f.Name] = f
	}
	return list, byName
}

// sortProblems orders problems as docs/settings.md lists the variables, after the
// database-mode leftovers (which have no field), because those explain the rest.
func sortProblems(list []Problem) {
	rank := map[string]int{}
	for i, f := range fields {
		rank[f.Var] = i
	}
	pos := func(v string) int {
		if r, ok := rank[v]; ok {
			return r
		}
		return -1
	}
	sort.SliceStable(list, func(i, j int) bool { return pos(list[i].Var) < pos(list[j].Var) })
}

// parsers replace caarlos0/env's parsers for the non-string types, for messages that say what
// to write instead of Go's strconv wording. The variable's name and default are added by Load.
var parsers = map[reflect.Type]env.ParserFunc{
	reflect.TypeFor[bool](): parseSwitch,
	reflect.TypeFor[int](): func(v string) (any, error) {
		n, err := parseWhole(v, strconv.IntSize)
		return int(n), err
	},
	reflect.TypeFor[int64](): func(v string) (any, error) { return parseWhole(v, 64) },
	reflect.TypeFor[time.Duration](): func(v string) (any, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("%s is not a duration: write a number with a unit, such as 15s, 2m or 1m30s", Quote(v))
		}
		return d, nil
	},
}

// parseSwitch accepts 1/0 (the form the app's own settings use) and true/false in any case.
func parseSwitch(v string) (any, error) {
	switch strings.ToLower(v) {
	case "1", "true":
		return true, nil
	case "0", "false":
		return false, nil
	}
	return nil, fmt.Errorf("%s is not a switch: write 1 for on or 0 for off (true and false work too)", Quote(v))
}

func parseWhole(v string, bits int) (int64, error) {
	n, err := strconv.ParseInt(v, 10, bits)
	if errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%s is too large", Quote(v))
	}
	if err != nil {
		return 0, fmt.Errorf("%s is not a whole number: write digits only", Quote(v))
	}
	return n, nil
}
