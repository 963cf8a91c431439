package settings

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/caarlos0/env/v11"

	"github.com/rte-project/rte/internal/config"

	"github.com/rte-project/rte/protocol"
)

// Settings is `rte-app serve`'s configuration, one field per environment variable
// (docs/reference-app.md lists them). A variable set to the empty string counts as unset.
type Settings struct {
	// Listen is where the HTTP server listens: registration and the admin API. The default
	// is loopback because the admin API is the keys to every runner.
	Listen string `env:"APP_LISTEN" envDefault:"127.0.0.1:8080"`
	// DB holds runners, jobs and records: an SQLite file, or a postgres:// URL for app nodes on
	// several hosts (package store).
	DB string `env:"APP_DB" envDefault:"rte-app.db"`
	// Node names this app node to the runners (X-App-Node, welcome); the hostname when unset.
	Node string `env:"APP_NODE"`
	// AdminToken guards the admin API (Authorization: Bearer).
	AdminToken config.Secret `env:"APP_ADMIN_TOKEN"`
	// JoinToken approves a registering runner that presents it, with no admin.
	JoinToken config.Secret `env:"RTE_JOIN_TOKEN"`
	// QueueMinutes is how long a job waits for its runner before it ends with status error.
	QueueMinutes int `env:"RTE_QUEUE_MINUTES" envDefault:"60"`
	// FilesMaxMB bounds a directory sent to a transfer-mode runner (MiB, of file bytes before
	// compression); a job whose directory is larger ends error, saying to mount it on the RTE.
	FilesMaxMB int `env:"RTE_FILES_MAX_MB" envDefault:"512"`
	// PlaybooksPath and InventoryPath are the app's own copy of the playbook directory and of
	// the inventory directory, sent as bundles to runners with RTE_FILES=transfer. Unset
	// PlaybooksPath: the app sends no files, and such runners are refused jobs.
	PlaybooksPath string `env:"APP_PLAYBOOKS_PATH"`
	InventoryPath string `env:"APP_INVENTORY_PATH"`
	// BundleCacheMB bounds the packed bundles kept beside the database (MiB).
	BundleCacheMB int    `env:"APP_BUNDLE_CACHE_MB" envDefault:"2048"`
	LogLevel      string `env:"LOG_LEVEL" envDefault:"info"`
	LogFormat     string `env:"LOG_FORMAT" envDefault:"json"`

	// SecretKey seals job secrets in the database so that every app node sharing it can
	// dispatch any job; the same on every node (seed.go).
	SecretKey config.Secret `env:"APP_SECRET_KEY"`
	// Seed is the config seed: a YAML file of runners and their credentials (seed.go).
	Seed string `env:"APP_SEED"`
	// seed is the config seed as checked at load (seed.go); nil without APP_SEED.
	seed *loadedSeed
}

// QueueTimeout is RTE_QUEUE_MINUTES as a duration.
func (s *Settings) QueueTimeout() time.Duration { return time.Duration(s.QueueMinutes) * time.Minute }

// Load reads the settings from environ ("K=V" strings) and checks them, never the
// process environment itself, so a test can hand it a table. hostname is APP_NODE's default.
func Load(environ []string, hostname string) (*Settings, error) {
	vars := env.ToMap(environ)
	s := &Settings{}
	p := &config.Problems{}
	failed := map[string]bool{}
	if err := env.ParseWithOptions(s, env.Options{Environment: vars}); err != nil {
		var agg env.AggregateError
		if !errors.As(err, &agg) {
			return nil, fmt.Errorf("parse settings: %w", err)
		}
		for _, e := range agg.Errors {
			var pe env.ParseError
			if !errors.As(e, &pe) {
				return nil, fmt.Errorf("parse settings: %w", e)
			}
			name, def := settingVar(pe.Name)
			failed[name] = true
			p.Add(name, "%s is not a whole number; the default is %s", config.Quote(vars[name]), def)
		}
	}
	if s.Node == "" {
		s.Node = hostname
	}
	s.check(p, failed)
	s.checkNodeSettings(vars, p)
	if len(p.List) > 0 {
		return nil, p
	}
	return s, nil
}

func (s *Settings) check(p *config.Problems, failed map[string]bool) {
	if s.Listen == "" {
		p.Add("APP_LISTEN", "is empty; give host:port, such as 127.0.0.1:8080")
	} else if host, port, err := net.SplitHostPort(s.Listen); err != nil {
		p.Add("APP_LISTEN", "%s is not host:port (%v); give one such as 127.0.0.1:8080, or :8080 for every address", config.Quote(s.Listen), err)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.Add("APP_LISTEN", "port %s of %s is not a number from 0 to 65535", config.Quote(port), config.Quote(s.Listen))
	} else if host != "" && net.ParseIP(host) == nil && strings.ContainsAny(host, " /") {
		p.Add("APP_LISTEN", "host %s of %s is not an address or a name", config.Quote(host), config.Quote(s.Listen))
	}
	if strings.TrimSpace(s.DB) == "" {
		p.Add("APP_DB", "is empty; give the SQLite file to keep runners and jobs in, such as rte-app.db, or a PostgreSQL URL, such as postgres://rte:PASSWORD@db.example.com/rte")
	}
	if s.Node == "" || len(s.Node) > 128 || strings.IndexFunc(s.Node, unicode.IsControl) >= 0 {
		p.Add("APP_NODE", "%s must be 1 to 128 printable characters; it names this app node to the runners", config.Quote(s.Node))
	}
	switch token := string(s.AdminToken); {
	case token == "":
		p.Add("APP_ADMIN_TOKEN", "is required: it guards the admin API; generate one with: openssl rand -hex 32")
	case len(token) < protocol.MinTokenLength:
		p.Add("APP_ADMIN_TOKEN", "is %d characters; use at least %d so it cannot be guessed (openssl rand -hex 32)", len(token), protocol.MinTokenLength)
	case !printableToken(token):
		p.Add("APP_ADMIN_TOKEN", "holds spaces or control characters; it travels in an Authorization header, so use printable characters only (openssl rand -hex 32)")
	}
	if token := string(s.JoinToken); token != "" {
		switch {
		case len(token) < protocol.MinTokenLength:
			p.Add("RTE_JOIN_TOKEN", "is %d characters; use at least %d so it cannot be guessed, or leave it unset so an admin approves every runner", len(token), protocol.MinTokenLength)
		case !printableToken(token):
			p.Add("RTE_JOIN_TOKEN", "holds spaces or control characters; use printable characters only")
		}
	}
	if !failed["RTE_QUEUE_MINUTES"] && s.QueueMinutes < 1 {
		p.Add("RTE_QUEUE_MINUTES", "is %d; give the minutes a job may wait for its runner, at least 1 (default 60)", s.QueueMinutes)
	}
	if !failed["RTE_FILES_MAX_MB"] && s.FilesMaxMB < 1 {
		p.Add("RTE_FILES_MAX_MB", "is %d; give at least 1 (MiB, default 512)", s.FilesMaxMB)
	}
	if !failed["APP_BUNDLE_CACHE_MB"] && s.BundleCacheMB < 1 {
		p.Add("APP_BUNDLE_CACHE_MB", "is %d; give at least 1 (MiB, default 2048)", s.BundleCacheMB)
	}
	for _, d := range []struct{ name, path string }{{"APP_PLAYBOOKS_PATH", s.PlaybooksPath}, {"APP_INVENTORY_PATH", s.InventoryPath}} {
		if d.path == "" {
			continue
		}
		if fi, err := os.Stat(d.path); err != nil {
			p.Add(d.name, "%s cannot be read (%v); give the directory the app packs for runners with RTE_FILES=transfer", config.Quote(d.path), err)
		} else if !fi.IsDir() {
			p.Add(d.name, "%s is not a directory", config.Quote(d.path))
		}
	}
	if s.InventoryPath != "" && s.PlaybooksPath == "" {
		p.Add("APP_INVENTORY_PATH", "is set without APP_PLAYBOOKS_PATH; the app sends files only when it has the playbooks too")
	}
	s.LogLevel = strings.ToLower(s.LogLevel)
	if s.LogLevel != "debug" && s.LogLevel != "info" && s.LogLevel != "warn" && s.LogLevel != "error" {
		p.Add("LOG_LEVEL", "%s is not debug, info, warn or error", config.Quote(s.LogLevel))
	}
	s.LogFormat = strings.ToLower(s.LogFormat)
	if s.LogFormat != "json" && s.LogFormat != "console" {
		p.Add("LOG_FORMAT", "%s is not json or console", config.Quote(s.LogFormat))
	}
}

// printableToken reports whether a token can travel in an HTTP header as it is.
func printableToken(t string) bool {
	return strings.IndexFunc(t, func(r rune) bool { return r <= ' ' || r == 0x7f || r > unicode.MaxASCII }) < 0
}

// settingVar returns the variable and default of the settings field named field.
func settingVar(field string) (name, def string) {
	f, ok := reflect.TypeFor[Settings]().FieldByName(field)
	if !ok {
		return field, "unset"
	}
	return f.Tag.Get("env"), f.Tag.Get("envDefault")
}

// Hostname is APP_NODE's default: the machine's name, or rte-app when it has none.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "rte-app"
	}
	return h
}

// NewToken is 32 random bytes as hex, what `openssl rand -hex 32` gives: a token nobody guesses.
// The demo makes its tokens with it, and the admin page its session ids.
func NewToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
