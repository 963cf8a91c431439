package config_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/protocol"
)

const token = "tok-0123456789abcdef" // 20 characters, valid

// base is the smallest valid environment.
var base = []string{"RTE_TOKEN=" + token}

func with(kv ...string) []string { return append(slices.Clone(base), kv...) }

func mustLoad(t *testing.T, environ []string) *config.Settings {
	t.Helper()
	s, err := config.Load(environ, "box")
	if err != nil {
		t.Fatalf("Load(%q): want no error, got:\n%v", environ, err)
	}
	return s
}

func problemsOf(t *testing.T, environ []string) *config.Problems {
	t.Helper()
	_, err := config.Load(environ, "box")
	var p *config.Problems
	if !errors.As(err, &p) {
		t.Fatalf("Load(%q): want *config.Problems, got %T: %v", environ, err, err)
	}
	return p
}

// secretValues are the values in environ that must never be shown back.
func secretValues(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case len(v) < 4:
		case k == "RTE_TOKEN", k == "RTE_JOIN_TOKEN", k == "METRICS_TOKEN", k == "ENCRYPTION_SECRET", k == "DB_PASSWORD":
			out = append(out, v)
		}
	}
	return out
}

func TestRefusals(t *testing.T) {
	longName := strings.Repeat("n", 129)
	tests := []struct {
		name    string
		environ []string
		wantVar string
		phrase  string
	}{
		{"missing token", nil, "RTE_TOKEN", "not set"},
		{"empty token counts as missing", []string{"RTE_TOKEN="}, "RTE_TOKEN", "not set"},
		{"short token", []string{"RTE_TOKEN=secret-15-chars"}, "RTE_TOKEN", "too short"},
		{"job env allow with a path", with("RTE_JOB_ENV_ALLOW=PATH,/etc/passwd"), "RTE_JOB_ENV_ALLOW", `"/etc/passwd" is not a variable name or a NAME_* prefix pattern`},
		{"job env allow of everything", with("RTE_JOB_ENV_ALLOW=*"), "RTE_JOB_ENV_ALLOW", "is not a variable name"},
		{"token with carriage return", []string{"RTE_TOKEN=" + token + "\r"}, "RTE_TOKEN", "control characters"},
		{"join token with trailing space", with("RTE_JOIN_TOKEN=join-secret "), "RTE_JOIN_TOKEN", "spaces at either end"},
		{"metrics token with newline", with("METRICS_TOKEN=metrics\nsecret"), "METRICS_TOKEN", "control characters"},
		{"unknown mode", with("RTE_MODE=sideways"), "RTE_MODE", "not a mode"},
		{"unknown engine", with("RTE_ENGINE=lxc"), "RTE_ENGINE", "not an engine"},
		{"podman without image", with("RTE_ENGINE=podman"), "RTE_IMAGE", "required with RTE_ENGINE=podman"},
		{"images allow with a space", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_IMAGES_ALLOW=ee:1, ee 2"), "RTE_IMAGES_ALLOW", `"ee 2" is not an image reference or pattern`},
		{"images allow with a ?", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_IMAGES_ALLOW=ee-?"), "RTE_IMAGES_ALLOW", "is not an image reference or pattern"},
		{"image that hello could not carry", with("RTE_ENGINE=docker", "RTE_IMAGE=-v"), "RTE_IMAGE", "not an image reference"},
		{"docker without image", with("RTE_ENGINE=docker"), "RTE_IMAGE", "required with RTE_ENGINE=docker"},
		{"image with a space", with("RTE_ENGINE=docker", "RTE_IMAGE=rte dev"), "RTE_IMAGE", "not an image reference"},
		{"docker with local files", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_FILES=local", "ANSIBLE_PATH=/a", "REPO_PATH=/r"), "RTE_ENGINE", "RTE_FILES=local"},
		{"bad pull policy", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_PULL=sometimes"), "RTE_PULL", "not a pull policy"},
		{"bad engine host", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_ENGINE_HOST=/var/run/docker.sock"), "RTE_ENGINE_HOST", "unix:///var/run/docker.sock"},
		{"bad cpus", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_JOB_CPUS=-1"), "RTE_JOB_CPUS", "not a number of CPUs"},
		{"bad memory", with("RTE_ENGINE=docker", "RTE_IMAGE=rte:dev", "RTE_JOB_MEMORY=1k"), "RTE_JOB_MEMORY", "at least 6m"},
		{"database mode", with("RTE_MODE=database"), "RTE_MODE", "database mode (7.0-7.2"},
		{"database mode names leftovers", with("RTE_MODE=database", "DB_HOST=db"), "RTE_MODE", "remove DB_HOST"},
		{"database mode points at the doc", with("RTE_MODE=database"), "RTE_MODE", "docs/migration-from-database-mode.md"},
		{"leftover DB_HOST", with("DB_HOST=db.example.com"), "DB_HOST", "left over from database mode"},
		{"leftover DB_PASSWORD", with("DB_PASSWORD=hunter2-db"), "DB_PASSWORD", "remove it"},
		{"leftover any DB_ name", with("DB_SSL_CA=/ca.pem"), "DB_SSL_CA", "RTE_MODE=outbound with APP_URL"},
		{"leftover ENCRYPTION_SECRET", with("ENCRYPTION_SECRET=enc-secret-value"), "ENCRYPTION_SECRET", "from the RTE only"},
		{"leftover RTE_REGISTER", with("RTE_REGISTER=1"), "RTE_REGISTER", "docs/migration-from-database-mode.md"},
		{"leftover beside a socket mode", with("RTE_MODE=outbound", "APP_URL=https://app", "DB_USER=af"), "DB_USER", "RTE_MODE=outbound is already set"},
		{"inbound APP_URL without RTE_URL", with("APP_URL=https://app.example.com"), "RTE_URL", "required in inbound mode"},
		{"RTE_URL without scheme", with("RTE_URL=rte01:8000"), "RTE_URL", "no http:// or https://"},
		{"RTE_URL wrong scheme", with("RTE_URL=ftp://rte01"), "RTE_URL", "use http:// or https://"},
		{"APP_URL without host", with("APP_URL=https://"), "APP_URL", "names no host"},
		{"APP_URL with credentials", with("APP_URL=https://admin:pa55word@app"), "APP_URL", "user name or password"},
		{"APP_URL with query", with("APP_URL=https://app/?x=1"), "APP_URL", "query or fragment"},
		{"outbound without APP_URL", with("RTE_MODE=outbound"), "APP_URL", "required in outbound mode"},
		{"port zero", with("PORT=0"), "PORT", "not a TCP port"},
		{"port too high", with("PORT=65536"), "PORT", "not a TCP port"},
		{"port not a number", with("PORT=80a"), "PORT", "not a whole number"},
		{"port overflows", with("PORT=99999999999999999999"), "PORT", "too large"},
		{"listen host with brackets", with("LISTEN_HOST=[::1]"), "LISTEN_HOST", "without port or brackets"},
		{"listen host with port", with("LISTEN_HOST=127.0.0.1:80"), "LISTEN_HOST", "not an address"},
		{"HTTPS not a switch", with("HTTPS=yes"), "HTTPS", "write 1 for on or 0 for off"},
		{"APP_TLS_VERIFY not a switch", with("APP_TLS_VERIFY=maybe"), "APP_TLS_VERIFY", "not a switch"},
		{"max jobs negative", with("RTE_MAX_JOBS=-1"), "RTE_MAX_JOBS", "negative"},
		{"max jobs not a number", with("RTE_MAX_JOBS=ten"), "RTE_MAX_JOBS", "not a whole number"},
		{"drain negative", with("RTE_DRAIN_SECONDS=-5"), "RTE_DRAIN_SECONDS", "negative"},
		{"cache zero", with("RTE_CACHE_MB=0"), "RTE_CACHE_MB", "at least 1"},
		{"buffer with unit", with("PROCESS_MAX_BUFFER=100MiB"), "PROCESS_MAX_BUFFER", "not a whole number"},
		{"buffer zero", with("PROCESS_MAX_BUFFER=0"), "PROCESS_MAX_BUFFER", "at least 1"},
		{"ping without unit", with("RTE_PING_INTERVAL=15"), "RTE_PING_INTERVAL", "not a duration"},
		{"ping zero", with("RTE_PING_INTERVAL=0s"), "RTE_PING_INTERVAL", "not positive"},
		{"dead after not a duration", with("RTE_DEAD_AFTER=soon"), "RTE_DEAD_AFTER", "not a duration"},
		{"dead after within ping", with("RTE_DEAD_AFTER=10s"), "RTE_DEAD_AFTER", "not longer than RTE_PING_INTERVAL"},
		{"dead after equal to ping", with("RTE_PING_INTERVAL=20s", "RTE_DEAD_AFTER=20s"), "RTE_DEAD_AFTER", "not longer than RTE_PING_INTERVAL"},
		{"cache stale time too short", with("RTE_CACHE_STALE_AFTER=1s"), "RTE_CACHE_STALE_AFTER", "at least 2s"},
		{"local files without ANSIBLE_PATH", with("RTE_FILES=local", "REPO_PATH=/repo"), "ANSIBLE_PATH", "required when RTE_FILES=local"},
		{"local files without REPO_PATH", with("RTE_FILES=local", "ANSIBLE_PATH=/pb"), "REPO_PATH", "required when RTE_FILES=local"},
		{"unknown file mode", with("RTE_FILES=remote"), "RTE_FILES", "not a file mode"},
		{"shared directory", with("RTE_CACHE_PATH=./spool/"), "RTE_CACHE_PATH", "also RTE_SPOOL_PATH"},
		{"unknown log level", with("LOG_LEVEL=verbose"), "LOG_LEVEL", "not a level"},
		{"unknown log format", with("LOG_FORMAT=xml"), "LOG_FORMAT", "not a format"},
		{"proxy scheme", with("HTTPS_PROXY=https://proxy:3128"), "HTTPS_PROXY", "use http:// (or socks5://)"},
		{"lower-case proxy named as set", with("https_proxy=ftp://proxy"), "https_proxy", "use http://"},
		{"proxy without host", with("HTTPS_PROXY=http://user:proxy-pass@"), "HTTPS_PROXY", "names no host"},
		{"name too long", with("RTE_NAME=" + longName), "RTE_NAME", "at most 128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load(tt.environ, "box")
			var p *config.Problems
			if !errors.As(err, &p) {
				t.Fatalf("want *config.Problems, got %T: %v", err, err)
			}
			found := false
			for _, pr := range p.List {
				if pr.Var == tt.wantVar && strings.Contains(pr.Message, tt.phrase) {
					found = true
				}
			}
			if !found {
				t.Errorf("want a problem for %s saying %q, got:\n%v", tt.wantVar, tt.phrase, err)
			}
			for _, secret := range append(secretValues(tt.environ), "pa55word", "proxy-pass") {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("problems show the secret %q:\n%v", secret, err)
				}
			}
		})
	}
}

func TestAllProblemsReportedTogether(t *testing.T) {
	p := problemsOf(t, []string{
		"RTE_MODE=database", "DB_HOST=db", "DB_PASSWORD=pw-pw-pw",
		"PORT=http", "HTTPS=maybe", "RTE_DEAD_AFTER=5s", "LOG_LEVEL=loud", "RTE_FILES=local",
	})
	var vars []string
	for _, pr := range p.List {
		vars = append(vars, pr.Var)
	}
	want := []string{"DB_HOST", "DB_PASSWORD", "RTE_MODE", "PORT", "HTTPS", "RTE_TOKEN", "ANSIBLE_PATH", "REPO_PATH", "LOG_LEVEL", "RTE_DEAD_AFTER"}
	if !slices.Equal(vars, want) {
		t.Errorf("want one problem each, leftovers first, then in the order of the docs:\n want %v\n got  %v\n%v", want, vars, p)
	}
	if lines := strings.Split(p.Error(), "\n"); len(lines) != len(p.List) {
		t.Errorf("want one line per problem (%d), got %d lines:\n%v", len(p.List), len(lines), p)
	}
}

func TestDefaults(t *testing.T) {
	s := mustLoad(t, base)
	checks := []struct {
		name      string
		got, want any
	}{
		{"RTE_MODE", s.Mode, protocol.ModeInbound},
		{"PORT", s.Port, 8000},
		{"LISTEN_HOST", s.ListenHost, ""},
		{"ListenAddr", s.ListenAddr(), ":8000"},
		{"HTTPS", s.HTTPS, false},
		{"HTTPS_KEY", s.HTTPSKey, "certificates/key.pem"},
		{"HTTPS_CERT", s.HTTPSCert, "certificates/cert.pem"},
		{"RTE_TOKEN", string(s.Token), token},
		{"RTE_NAME", s.Name, "rte-box-8000"},
		{"APP_URL", s.AppURL, ""},
		{"RTE_URL", s.RTEURL, ""},
		{"RTE_JOIN_TOKEN", string(s.JoinToken), ""},
		{"APP_TLS_VERIFY", s.AppTLSVerify, true},
		{"NODE_EXTRA_CA_CERTS", s.ExtraCACerts, ""},
		{"HTTPS_PROXY", string(s.HTTPSProxy), ""},
		{"NO_PROXY", s.NoProxy, ""},
		{"RTE_MAX_JOBS", s.MaxJobs, 10},
		{"RTE_DRAIN_SECONDS", s.DrainTimeout(), 25 * time.Second},
		{"RTE_SPOOL_PATH", s.SpoolPath, "spool"},
		{"RTE_FILES", s.Files, protocol.FilesTransfer},
		{"RTE_CACHE_PATH", s.CachePath, "cache"},
		{"RTE_CACHE_MB", s.CacheBytes(), int64(1024 << 20)},
		{"ANSIBLE_PATH", s.AnsiblePath, ""},
		{"REPO_PATH", s.RepoPath, ""},
		{"METRICS_TOKEN", string(s.MetricsToken), ""},
		{"LOG_LEVEL", s.LogLevel, "info"},
		{"LOG_FORMAT", s.LogFormat, "json"},
		{"PROCESS_MAX_BUFFER", s.ProcessMaxBuffer, int64(100 << 20)},
		{"RTE_PING_INTERVAL", s.PingInterval, protocol.PingInterval},
		{"RTE_DEAD_AFTER", s.DeadAfter, protocol.DeadAfter},
		{"RTE_WORK_PATH", s.WorkPath, "jobs"},
		{"RTE_CACHE_STALE_AFTER", s.CacheStaleAfter, 10 * time.Minute},
		{"RTE_JOB_ENV_ALLOW", strings.Join(s.JobEnvAllowList(), " "), "PATH HOME USER LOGNAME SHELL LANG LANGUAGE TZ TMPDIR SSH_AUTH_SOCK LC_* ANSIBLE_*"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: want default %v, got %v", c.name, c.want, c.got)
		}
	}
	if w := s.Warnings(); len(w) != 0 {
		t.Errorf("want no warnings for the defaults, got %q", w)
	}
}

// An empty value means unset everywhere: every variable set to "" gives the defaults.
func TestEmptyMeansUnset(t *testing.T) {
	environ := slices.Clone(base)
	for _, st := range mustLoad(t, base).Effective() {
		if st.Var != "RTE_TOKEN" {
			environ = append(environ, st.Var+"=")
		}
	}
	environ = append(environ, "https_proxy=", "no_proxy=", "DB_HOST=", "ENCRYPTION_SECRET=")
	got, want := mustLoad(t, environ).Effective(), mustLoad(t, base).Effective()
	if !slices.Equal(got, want) {
		t.Errorf("want empty values to give the defaults:\n want %v\n got  %v", want, got)
	}
}

func TestDefaultName(t *testing.T) {
	tests := []struct {
		hostname string
		environ  []string
		want     string
	}{
		{"box", base, "rte-box-8000"},
		{"box", with("PORT=9000"), "rte-box-9000"},
		{"", base, "rte-8000"},
		{"box", with("RTE_NAME=edge-1"), "edge-1"},
	}
	for _, tt := range tests {
		s, err := config.Load(tt.environ, tt.hostname)
		if err != nil {
			t.Fatalf("hostname %q, %q: %v", tt.hostname, tt.environ, err)
		}
		if s.Name != tt.want {
			t.Errorf("hostname %q, %q: want name %q, got %q", tt.hostname, tt.environ, tt.want, s.Name)
		}
	}

	// A host name too long for the default is refused, naming the variable that fixes it.
	_, err := config.Load(base, strings.Repeat("h", 130))
	var p *config.Problems
	if !errors.As(err, &p) || len(p.List) != 1 || p.List[0].Var != "RTE_NAME" || !strings.Contains(p.List[0].Message, "set a shorter RTE_NAME") {
		t.Errorf("long host name: want one RTE_NAME problem saying to set a shorter RTE_NAME, got %v", err)
	}
}

func TestNormalisation(t *testing.T) {
	s := mustLoad(t, with(
		"RTE_MODE=Outbound", "APP_URL=https://app.example.com/forms/", "LOG_LEVEL=DEBUG", "LOG_FORMAT=Console",
		"HTTPS=TRUE", "RTE_FILES=LOCAL", "ANSIBLE_PATH=/pb", "REPO_PATH=/repo", "HTTPS_PROXY=proxy.example.com:3128",
		"LISTEN_HOST=::1",
	))
	checks := []struct{ name, got, want string }{
		{"RTE_MODE", s.Mode, "outbound"},
		{"APP_URL", s.AppURL, "https://app.example.com/forms"},
		{"LOG_LEVEL", s.LogLevel, "debug"},
		{"LOG_FORMAT", s.LogFormat, "console"},
		{"HTTPS", fmt.Sprint(s.HTTPS), "true"},
		{"RTE_FILES", s.Files, "local"},
		{"HTTPS_PROXY", string(s.HTTPSProxy), "http://proxy.example.com:3128"},
		{"ListenAddr", s.ListenAddr(), "[::1]:8000"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: want %q, got %q", c.name, c.want, c.got)
		}
	}
}

func TestProxyFallsBackToLowerCase(t *testing.T) {
	s := mustLoad(t, with("https_proxy=http://lower:3128", "no_proxy=.internal"))
	if string(s.HTTPSProxy) != "http://lower:3128" || s.NoProxy != ".internal" {
		t.Errorf("want the lower-case proxy settings, got %q and %q", string(s.HTTPSProxy), s.NoProxy)
	}
	want := map[string]string{"HTTPS_PROXY": "http://lower:3128 (from https_proxy)", "NO_PROXY": ".internal (from no_proxy)"}
	for _, st := range s.Effective() {
		if w, ok := want[st.Var]; ok && st.Value != w {
			t.Errorf("Effective %s: want %q, got %q", st.Var, w, st.Value)
		}
	}

	s = mustLoad(t, with("HTTPS_PROXY=http://upper:3128", "https_proxy=http://lower:3128"))
	if string(s.HTTPSProxy) != "http://upper:3128" {
		t.Errorf("want HTTPS_PROXY to win over https_proxy, got %q", string(s.HTTPSProxy))
	}
}

func TestEffectiveHidesSecrets(t *testing.T) {
	secrets := []string{token, "join-token-value", "metrics-token-value", "proxyuser", "proxy-password"}
	s := mustLoad(t, with(
		"RTE_MODE=outbound", "APP_URL=https://app.example.com",
		"RTE_JOIN_TOKEN=join-token-value", "METRICS_TOKEN=metrics-token-value",
		"HTTPS_PROXY=http://proxyuser:proxy-password@proxy.example.com:3128",
	))
	eff := s.Effective()
	if len(eff) != 40 {
		t.Errorf("want the 40 variables of docs/settings.md, got %d", len(eff))
	}
	want := map[string]string{
		"RTE_TOKEN":      "set (fingerprint " + protocol.TokenFingerprint(token) + ")",
		"RTE_JOIN_TOKEN": "set",
		"METRICS_TOKEN":  "set",
		"HTTPS_PROXY":    "http://proxy.example.com:3128 (credentials not shown)",
	}
	seen := map[string]bool{}
	for _, st := range eff {
		if seen[st.Var] {
			t.Errorf("Effective lists %s twice", st.Var)
		}
		seen[st.Var] = true
		if w, ok := want[st.Var]; ok && (st.Value != w || !st.Secret) {
			t.Errorf("Effective %s: want %q marked secret, got %q (secret %v)", st.Var, w, st.Value, st.Secret)
		}
	}

	// Settings passed whole to fmt or encoding/json must not leak either.
	js, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"Effective": fmt.Sprint(eff), "%+v": fmt.Sprintf("%+v", s), "%#v": fmt.Sprintf("%#v", *s),
		"json": string(js), "Warnings": fmt.Sprint(s.Warnings()),
	} {
		for _, secret := range secrets {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows the secret %q: %s", name, secret, text)
			}
		}
	}

	unset := mustLoad(t, base).Effective()
	for _, st := range unset {
		if st.Var == "METRICS_TOKEN" && (st.Value != "unset" || !st.Secret) {
			t.Errorf("unset METRICS_TOKEN: want \"unset\" marked secret, got %q (secret %v)", st.Value, st.Secret)
		}
	}
}

func TestLoadIgnoresProcessEnvironment(t *testing.T) {
	t.Setenv("RTE_TOKEN", token)
	t.Setenv("PORT", "9999")
	t.Setenv("DB_HOST", "db.example.com")

	p := problemsOf(t, nil)
	if len(p.List) != 1 || p.List[0].Var != "RTE_TOKEN" {
		t.Errorf("want only RTE_TOKEN missing from an empty table, got:\n%v", p)
	}
	if s := mustLoad(t, base); s.Port != 8000 {
		t.Errorf("want PORT 8000 from the table's defaults, got %d from the process", s.Port)
	}
}

func TestWarnings(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		phrase  string
	}{
		{"TLS verification off", with("APP_TLS_VERIFY=0"), "APP_TLS_VERIFY=0: the app's certificate is not verified"},
		{"CA unused without verification", with("APP_TLS_VERIFY=false", "NODE_EXTRA_CA_CERTS=/ca.pem"), "NODE_EXTRA_CA_CERTS is not used"},
		{"join token without APP_URL", with("RTE_JOIN_TOKEN=join-secret"), "RTE_JOIN_TOKEN is set but APP_URL is not"},
		{"RTE_URL in outbound", with("RTE_MODE=outbound", "APP_URL=https://app", "RTE_URL=https://rte"), "RTE_URL is not used in outbound mode"},
		{"paths unused in transfer", with("ANSIBLE_PATH=/pb"), "ANSIBLE_PATH is not used while RTE_FILES=transfer"},
		{"https URL without TLS", with("APP_URL=https://app", "RTE_URL=https://rte:8000"), "RTE_URL is https:// but HTTPS=0"},
		{"http URL with TLS", with("APP_URL=https://app", "RTE_URL=http://rte:8000", "HTTPS=1"), "RTE_URL is http:// but HTTPS=1"},
		{"plain app URL", with("RTE_MODE=outbound", "APP_URL=http://app.example.com"), "APP_URL is http://"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := mustLoad(t, tt.environ).Warnings()
			if !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, tt.phrase) }) {
				t.Errorf("want a warning saying %q, got %q", tt.phrase, w)
			}
			for _, secret := range secretValues(tt.environ) {
				if strings.Contains(fmt.Sprint(w), secret) {
					t.Errorf("warnings show the secret %q: %q", secret, w)
				}
			}
		})
	}

	if w := mustLoad(t, with("RTE_MODE=outbound", "APP_URL=http://127.0.0.1:3000")).Warnings(); len(w) != 0 {
		t.Errorf("want no warning for plain http to loopback, got %q", w)
	}
}

// RTE_ENGINE_HOST defaults to the engine's usual socket; RTE_IMAGES_ALLOW is split at commas.
func TestEngineDefaults(t *testing.T) {
	for engine, host := range map[string]string{"docker": "unix:///var/run/docker.sock", "podman": "unix:///run/podman/podman.sock"} {
		s := mustLoad(t, with("RTE_ENGINE="+engine, "RTE_IMAGE=rte:dev", "RTE_IMAGES_ALLOW= registry.example/ee-*:* ,,rte-ee:1"))
		if s.EngineHost != host {
			t.Errorf("RTE_ENGINE=%s: RTE_ENGINE_HOST = %q, want %q", engine, s.EngineHost, host)
		}
		if got := s.ImagesAllowList(); !slices.Equal(got, []string{"registry.example/ee-*:*", "rte-ee:1"}) {
			t.Errorf("ImagesAllowList = %q", got)
		}
	}
	if s := mustLoad(t, with("RTE_ENGINE=podman", "RTE_IMAGE=rte:dev", "RTE_ENGINE_HOST=unix:///tmp/p.sock")); s.EngineHost != "unix:///tmp/p.sock" {
		t.Errorf("a set RTE_ENGINE_HOST became %q", s.EngineHost)
	}
}

// The reference page must list every variable Load reads.
func TestDocsListEveryVariable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/settings.md")
	if err != nil {
		t.Fatalf("read the settings reference: %v", err)
	}
	for _, st := range mustLoad(t, base).Effective() {
		if !strings.Contains(string(doc), "`"+st.Var+"`") {
			t.Errorf("docs/settings.md does not list `%s`", st.Var)
		}
	}
}

// FuzzLoad feeds one arbitrary value to one variable: Load must not panic, and whatever it
// says must keep its shape (one line per problem, every problem named) and hide the token.
func FuzzLoad(f *testing.F) {
	names := []string{}
	for _, st := range mustLoadF(f).Effective() {
		names = append(names, st.Var)
	}
	names = append(names, "DB_HOST", "https_proxy", "no_proxy")
	f.Add(uint8(0), "database")
	f.Add(uint8(1), "-1")
	f.Add(uint8(9), "https://u:p@host/?q#f")
	f.Add(uint8(29), "1h")
	f.Fuzz(func(t *testing.T, i uint8, value string) {
		name := names[int(i)%len(names)]
		environ := with(name + "=" + value)
		s, err := config.Load(environ, "box")
		if err != nil {
			var p *config.Problems
			if !errors.As(err, &p) || len(p.List) == 0 {
				t.Fatalf("%s=%q: want *config.Problems with at least one problem, got %T: %v", name, value, err, err)
			}
			if lines := strings.Split(p.Error(), "\n"); len(lines) != len(p.List) {
				t.Fatalf("%s=%q: want %d lines, got %d:\n%v", name, value, len(p.List), len(lines), p)
			}
			for _, pr := range p.List {
				if pr.Var == "" || pr.Message == "" {
					t.Fatalf("%s=%q: problem without variable or message: %+v", name, value, pr)
				}
			}
			return
		}
		if got := len(s.Effective()); got != 40 {
			t.Fatalf("%s=%q: want 40 effective settings, got %d", name, value, got)
		}
		want := "set (fingerprint " + protocol.TokenFingerprint(string(s.Token)) + ")"
		for _, st := range s.Effective() {
			if st.Var == "RTE_TOKEN" && st.Value != want {
				t.Fatalf("%s=%q: want RTE_TOKEN shown as %q, got %q", name, value, want, st.Value)
			}
		}
		if _, _, err := net.SplitHostPort(s.ListenAddr()); err != nil {
			t.Fatalf("%s=%q: ListenAddr %q does not split: %v", name, value, s.ListenAddr(), err)
		}
	})
}

func mustLoadF(f *testing.F) *config.Settings {
	s, err := config.Load(base, "box")
	if err != nil {
		f.Fatal(err)
	}
	return s
}

// The example output in the docs must be what Load says, word for word.
func TestDocsShowRealOutput(t *testing.T) {
	examples := []struct {
		doc     string
		environ []string
	}{
		{"../../docs/settings.md", []string{"RTE_MODE=outbound", "PORT=80a", "HTTPS=yes", "RTE_DEAD_AFTER=10s"}},
		{"../../docs/migration-from-database-mode.md", with("RTE_MODE=database", "DB_HOST=db", "ENCRYPTION_SECRET=enc-secret")},
	}
	for _, ex := range examples {
		doc, err := os.ReadFile(ex.doc)
		if err != nil {
			t.Fatalf("read %s: %v", ex.doc, err)
		}
		for _, line := range strings.Split(problemsOf(t, ex.environ).Error(), "\n") {
			if !strings.Contains(string(doc), line+"\n") {
				t.Errorf("%s: want the example to show Load's line\n%s", ex.doc, line)
			}
		}
	}
}

// TestRefusedValuesShownAsWritten: check-config's table shows a value that did not parse as
// the operator wrote it, and a refused value gets no advice about its effect.
func TestRefusedValuesShownAsWritten(t *testing.T) {
	s, err := config.Load(with("RTE_MAX_JOBS=abc", "APP_TLS_VERIFY=no", "RTE_MODE=outbound", "APP_URL=https://app.example"), "box")
	var p *config.Problems
	if !errors.As(err, &p) || s == nil {
		t.Fatalf("Load: want problems and the settings parsed so far, got %v", err)
	}
	shown := map[string]string{}
	for _, e := range s.Effective() {
		shown[e.Var] = e.Value
	}
	for name, raw := range map[string]string{"RTE_MAX_JOBS": `"abc"`, "APP_TLS_VERIFY": `"no"`} {
		if !strings.HasPrefix(shown[name], raw+" (refused") {
			t.Errorf("Effective shows %s as %q, want the written %s marked refused", name, shown[name], raw)
		}
	}
	for _, w := range s.Warnings() {
		if strings.Contains(w, "APP_TLS_VERIFY") || strings.Contains(w, "not verified") {
			t.Errorf("a warning about the refused APP_TLS_VERIFY: %s", w)
		}
	}
	// The same value accepted (0) is warned about.
	ok := mustLoad(t, with("APP_TLS_VERIFY=0", "RTE_MODE=outbound", "APP_URL=https://app.example"))
	if !slices.ContainsFunc(ok.Warnings(), func(w string) bool { return strings.Contains(w, "not verified") }) {
		t.Errorf("APP_TLS_VERIFY=0 gets no warning: %q", ok.Warnings())
	}
}
