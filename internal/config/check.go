package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rte-project/rte/protocol"
)

// validEnvAllowEntry reports whether e is one entry of RTE_JOB_ENV_ALLOW: a variable name, or
// a prefix and "*", by the same rule a job's env names follow (protocol.ValidEnvName).
func validEnvAllowEntry(e string) bool {
	name, _ := strings.CutSuffix(e, "*")
	return protocol.ValidEnvName(name)
}

const (
	migrationDoc = "docs/migration-from-database-mode.md"

	// maxNameLength is the longest runner name the app accepts in hello (protocol's check).
	maxNameLength = 128
)

// check validates s after parsing, adding every problem to p. failed names variables whose
// value did not parse; their checks are skipped.
func (s *Settings) check(p *Problems, vars map[string]string, hostname string, failed map[string]bool) {
	s.Mode = strings.ToLower(s.Mode)
	s.Files = strings.ToLower(s.Files)
	s.LogLevel = strings.ToLower(s.LogLevel)
	s.LogFormat = strings.ToLower(s.LogFormat)

	checkDatabaseMode(p, vars, s.Mode)
	if s.Mode != protocol.ModeInbound && s.Mode != protocol.ModeOutbound && s.Mode != "database" {
		p.Add("RTE_MODE", "%s is not a mode: set inbound (the app dials this RTE) or outbound (this RTE dials APP_URL)", Quote(s.Mode))
	}

	if !failed["PORT"] && (s.Port < 1 || s.Port > 65535) {
		p.Add("PORT", "%d is not a TCP port: use 1 to 65535 (default 8000)", s.Port)
	}
	if s.ListenHost != "" && !validListenHost(s.ListenHost) {
		p.Add("LISTEN_HOST", "%s is not an address: give an IP address or host name without port or brackets, such as 127.0.0.1, ::1 or rte01.example.com, or leave it empty to listen on all addresses", Quote(s.ListenHost))
	}

	s.checkTokens(p)
	s.checkName(p, hostname, failed["PORT"])
	s.checkURLs(p)
	s.checkFiles(p)
	s.checkLimits(p, failed)
	s.checkEngine(p)

	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		p.Add("LOG_LEVEL", "%s is not a level: use debug, info, warn or error (default info)", Quote(s.LogLevel))
	}
	switch s.LogFormat {
	case "json", "console":
	default:
		p.Add("LOG_FORMAT", "%s is not a format: use json or console (default json)", Quote(s.LogFormat))
	}
}

// checkDatabaseMode refuses what is left of database mode (7.0-7.2). Each leftover is its
// own problem so that the list of variables to delete is complete; each message stands alone,
// because an operator may see only one line of it in a log viewer.
func checkDatabaseMode(p *Problems, vars map[string]string, mode string) {
	var leftovers []string
	for k, v := range vars {
		if v != "" && (strings.HasPrefix(k, "DB_") || k == "ENCRYPTION_SECRET" || k == "RTE_REGISTER") {
			leftovers = append(leftovers, k)
		}
	}
	sort.Strings(leftovers)

	const choose = "RTE_MODE=inbound with RTE_URL and APP_URL (the app dials this RTE) or RTE_MODE=outbound with APP_URL (this RTE dials the app)"
	if mode == "database" {
		remove := ""
		if len(leftovers) > 0 {
			remove = "remove " + strings.Join(leftovers, ", ") + " and "
		}
		p.Add("RTE_MODE", "database mode (7.0-7.2, where the RTE read jobs from the app's database) is gone: %sset %s; see %s", remove, choose, migrationDoc)
	}

	instead := "then set " + choose
	if vars["RTE_MODE"] != "" && (mode == protocol.ModeInbound || mode == protocol.ModeOutbound) {
		instead = "RTE_MODE=" + mode + " is already set and needs nothing in its place"
	}
	for _, k := range leftovers {
		what := "remove it"
		if k == "ENCRYPTION_SECRET" {
			// The app still needs its own ENCRYPTION_SECRET; only the RTE's copy goes.
			what = "remove it from the RTE only (the app keeps its own; job secrets now reach the RTE sealed with RTE_TOKEN)"
		}
		p.Add(k, "left over from database mode (7.0-7.2), which is gone: the RTE now gets jobs over its socket, never from the app's database; %s; %s; see %s", what, instead, migrationDoc)
	}
}

func (s *Settings) checkTokens(p *Problems) {
	tok := string(s.Token)
	switch {
	case tok == "":
		p.Add("RTE_TOKEN", "not set, and the RTE does not start without it: set a random string of at least %d characters (for example the output of openssl rand -hex 32) and give the runner the same token at the app", protocol.MinTokenLength)
	case utf8.RuneCountInString(tok) < protocol.MinTokenLength:
		// The length is not shown: even that narrows a guess.
		p.Add("RTE_TOKEN", "too short: use at least %d characters (for example the output of openssl rand -hex 32), and the same token for the runner at the app", protocol.MinTokenLength)
	}
	for _, t := range []struct {
		name  string
		value Secret
	}{{"RTE_TOKEN", s.Token}, {"RTE_JOIN_TOKEN", s.JoinToken}, {"METRICS_TOKEN", s.MetricsToken}} {
		if v := string(t.value); v != strings.TrimSpace(v) || strings.ContainsFunc(v, isControl) {
			// These travel in HTTP headers, which drop surrounding spaces and refuse control
			// characters, so the peer would never see the same token.
			p.Add(t.name, "contains spaces at either end or control characters (often a line break or carriage return copied with it): remove them")
		}
	}
}

func (s *Settings) checkName(p *Problems, hostname string, portFailed bool) {
	if s.Name == "" {
		if portFailed {
			return // the default name needs the port, which is already reported
		}
		s.Name = defaultName(hostname, s.Port)
		if len(s.Name) > maxNameLength {
			p.Add("RTE_NAME", "not set, and the default %s (from the host name) is longer than the %d bytes the app accepts: set a shorter RTE_NAME", Quote(s.Name), maxNameLength)
		}
		return
	}
	if len(s.Name) > maxNameLength {
		p.Add("RTE_NAME", "%s is %d bytes long: the app accepts at most %d; choose a shorter name", Quote(s.Name), len(s.Name), maxNameLength)
	}
	if strings.ContainsFunc(s.Name, isControl) {
		p.Add("RTE_NAME", "%s contains control characters: remove them", Quote(s.Name))
	}
}

func defaultName(hostname string, port int) string {
	if hostname == "" {
		return fmt.Sprintf("rte-%d", port)
	}
	return fmt.Sprintf("rte-%s-%d", hostname, port)
}

func (s *Settings) checkURLs(p *Problems) {
	s.AppURL = checkURL(p, "APP_URL", s.AppURL, "https://forms.example.com")
	s.RTEURL = checkURL(p, "RTE_URL", s.RTEURL, "https://rte01.example.com:8000")

	// Only the presence of the URLs counts here: a malformed one is reported above.
	switch {
	case s.Mode == protocol.ModeInbound && s.AppURL != "" && s.RTEURL == "":
		p.Add("RTE_URL", "required in inbound mode when APP_URL is set, because the RTE registers with the app and must tell it where to dial: set the address the app reaches this RTE at, such as https://rte01.example.com:8000, or unset APP_URL and add the runner at the app by hand")
	case s.Mode == protocol.ModeOutbound && s.AppURL == "":
		p.Add("APP_URL", "required in outbound mode, because this RTE dials the app: set the app's address, such as https://forms.example.com")
	}

	if s.HTTPSProxy != "" {
		s.HTTPSProxy = Secret(checkProxy(p, s.proxyFrom, string(s.HTTPSProxy)))
	}
}

// checkURL checks that raw is empty or an absolute http(s) URL with a host, and returns it
// without trailing slashes so that callers can append protocol paths.
func checkURL(p *Problems, name, raw, example string) string {
	if raw == "" {
		return ""
	}
	shown := Quote(raw)
	if strings.Contains(raw, "@") {
		shown = "the value" // it may carry a password
	}
	if !strings.Contains(raw, "://") {
		p.Add(name, "%s has no http:// or https:// in front: write it as %s", shown, example)
		return raw
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		p.Add(name, "%s is not a URL: write it as %s", shown, example)
	case u.Scheme != "http" && u.Scheme != "https":
		p.Add(name, "%s starts with %s: use http:// or https://, such as %s", shown, Quote(u.Scheme+"://"), example)
	case u.User != nil:
		p.Add(name, "contains a user name or password: remove it; the RTE authenticates with RTE_TOKEN")
	case u.Hostname() == "":
		p.Add(name, "%s names no host: write it as %s", shown, example)
	case u.RawQuery != "" || u.Fragment != "":
		p.Add(name, "%s has a query or fragment (?... or #...): remove it", shown)
	default:
		return strings.TrimRight(raw, "/")
	}
	return raw
}

// checkProxy checks a proxy URL and returns it with an explicit scheme. host:port alone means
// an HTTP proxy, as curl and Go read it. Only http and socks5 are accepted: the schemes that
// both the WebSocket dialer and the registration's HTTP client support. The value is never
// shown, since it may carry the proxy's password.
func checkProxy(p *Problems, name, raw string) string {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	const example = "http://proxy.example.com:3128"
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		p.Add(name, "is not a URL: write it as %s", example)
	case u.Scheme != "http" && u.Scheme != "socks5":
		p.Add(name, "starts with %s: use http:// (or socks5://), such as %s", Quote(u.Scheme+"://"), example)
	case u.Hostname() == "":
		p.Add(name, "names no host: write it as %s", example)
	}
	return raw
}

func (s *Settings) checkFiles(p *Problems) {
	switch s.Files {
	case protocol.FilesTransfer:
	case protocol.FilesLocal:
		if s.AnsiblePath == "" {
			p.Add("ANSIBLE_PATH", "required when RTE_FILES=local: set the directory holding the playbooks (a job's playbook is relative to it)")
		}
		if s.RepoPath == "" {
			p.Add("REPO_PATH", "required when RTE_FILES=local: set the directory holding the repositories (a job's inventories are relative to it)")
		}
	default:
		p.Add("RTE_FILES", "%s is not a file mode: use transfer (the app sends playbooks with each job) or local (they are on this RTE under ANSIBLE_PATH and REPO_PATH)", Quote(s.Files))
	}

	// Two of these sharing a directory would clean up each other's files.
	dirs := []struct{ name, path string }{
		{"RTE_SPOOL_PATH", s.SpoolPath}, {"RTE_CACHE_PATH", s.CachePath}, {"RTE_WORK_PATH", s.WorkPath},
	}
	for i, a := range dirs {
		for _, b := range dirs[:i] {
			if filepath.Clean(a.path) == filepath.Clean(b.path) {
				p.Add(a.name, "%s is also %s: give each its own directory", Quote(a.path), b.name)
			}
		}
	}
}

func (s *Settings) checkLimits(p *Problems, failed map[string]bool) {
	if !failed["RTE_MAX_JOBS"] && s.MaxJobs < 0 {
		p.Add("RTE_MAX_JOBS", "%d is negative: use 0 for no limit or the number of playbooks to run at once (default 10)", s.MaxJobs)
	}
	if !failed["RTE_DRAIN_SECONDS"] && s.DrainSeconds < 0 {
		p.Add("RTE_DRAIN_SECONDS", "%d is negative: use the seconds running jobs may take to finish after SIGTERM, or 0 to cancel them at once (default 25)", s.DrainSeconds)
	}
	if !failed["RTE_CACHE_MB"] && (s.CacheMB < 1 || int64(s.CacheMB) > math.MaxInt64>>20) {
		p.Add("RTE_CACHE_MB", "%d is out of range: give the cache's size in MiB, at least 1 (default 1024)", s.CacheMB)
	}
	if !failed["PROCESS_MAX_BUFFER"] && s.ProcessMaxBuffer < 1 {
		p.Add("PROCESS_MAX_BUFFER", "%d is too small: give the bytes of output kept per job, at least 1 (default 104857600, 100 MiB)", s.ProcessMaxBuffer)
	}
	pingOK := !failed["RTE_PING_INTERVAL"] && s.PingInterval > 0
	deadOK := !failed["RTE_DEAD_AFTER"] && s.DeadAfter > 0
	if !failed["RTE_PING_INTERVAL"] && !pingOK {
		p.Add("RTE_PING_INTERVAL", "%s is not positive: give the time between keepalive pings, such as 15s (the default)", s.PingInterval)
	}
	if !failed["RTE_DEAD_AFTER"] && !deadOK {
		p.Add("RTE_DEAD_AFTER", "%s is not positive: give the silence after which a socket is dead, such as 45s (the default)", s.DeadAfter)
	}
	if !failed["RTE_CACHE_STALE_AFTER"] && s.CacheStaleAfter < 2*time.Second {
		p.Add("RTE_CACHE_STALE_AFTER", "%s is too short: an RTE heartbeats every quarter of it, so give at least 2s (default 10m, and only tests have a reason to change it)", s.CacheStaleAfter)
	}
	for _, e := range s.JobEnvAllowList() {
		if !validEnvAllowEntry(e) {
			p.Add("RTE_JOB_ENV_ALLOW", "%s is not a variable name or a NAME_* prefix pattern: list names such as PATH,HOME,LC_* separated by commas", Quote(e))
			break
		}
	}
	if pingOK && deadOK && s.DeadAfter <= s.PingInterval {
		p.Add("RTE_DEAD_AFTER", "%s is not longer than RTE_PING_INTERVAL (%s), so a healthy socket would be declared dead between two pings: make it about three times the interval (defaults 45s and 15s)", s.DeadAfter, s.PingInterval)
	}
}

func validListenHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
