package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// version may be set at build time with -ldflags "-X main.version=1.2.3"; without it the
// module version Go recorded (a pseudo-version naming the commit, "+dirty" for changes, when
// built in a git checkout; the release when go install fetched one), else 0.0.0-dev.
var version = ""

// buildVersion is what `rte version`, hello and rte_build_info say: the version, then, unless
// it names the commit already, as semver build metadata the commit Go recorded at build time
// (vcs.revision, first 12 hex digits) and ".modified" when the tree had uncommitted changes
// (vcs.modified), so every build from a checkout says which source it is.
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = strings.TrimPrefix(bi.Main.Version, "v")
	}
	if v == "" {
		v = "0.0.0-dev"
	}
	return v + commitSuffix(v, bi.Settings)
}

func commitSuffix(v string, settings []debug.BuildSetting) string {
	var rev string
	modified := false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" || strings.Contains(v, rev[:min(12, len(rev))]) {
		return ""
	}
	suffix := "+" + rev[:min(12, len(rev))]
	if modified {
		suffix += ".modified"
	}
	return suffix
}

const usage = `usage: rte [command]     (rte <command> --help for one command)

commands:
  serve            run the RTE (the default when no command is given)
  check-config     print the effective settings (secrets redacted) and everything serve would
                   refuse at start; exit 0 or 2
  fingerprint [CERT]
                   print the certificate fingerprints of HTTPS_CERT (or CERT) and the token fingerprint
  version          print the version and the commit it was built from
  help             print this text

Settings come from the environment; docs/settings.md lists them. Exit status 2 means bad
usage or settings: nothing was started.
`

// commands are each command's arguments and what it does: the head of its --help answer.
var commands = map[string]struct {
	args    string
	maxArgs int
	what    string
}{
	"serve": {"", 0, "Run the RTE. Settings come from the environment (docs/settings.md); SIGTERM or SIGINT drain,\n" +
		"a second one stops at once; SIGHUP is ignored with a log line (settings are read once, at start)."},
	"check-config": {"", 0, "Print the effective settings (secrets redacted) and every problem serve would refuse at\n" +
		"start: values, files, directories. Exit 0 when serve would start, 2 when not."},
	"fingerprint": {"[CERT]", 1, "Print the fingerprints of HTTPS_CERT (or CERT) and of RTE_TOKEN, as the app's admin compares them."},
	"version":     {"", 0, "Print the version, the commit it was built from and the protocol version."},
	"help":        {"", 0, "Print the list of commands."},
}

// parseCommand parses a command's arguments: -h or --help prints its usage to stdout (done,
// exit 0); an unknown flag or too many arguments print why and the usage to stderr (done,
// exit 2). Otherwise it returns the positional arguments.
func parseCommand(name string, args []string, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	c := commands[name]
	fs := flag.NewFlagSet("rte "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rte %s %s\n\n%s\n", name, c.args, c.what)
	}
	// -h is a flag of its own so that help goes to stdout: it is the answer, not an error.
	help := fs.Bool("h", false, "print this help")
	fs.BoolVar(help, "help", false, "print this help")
	if err := fs.Parse(args); err != nil {
		return nil, exitSettings, true // the flag package printed why and the usage
	}
	if *help {
		fs.SetOutput(stdout)
		fs.Usage()
		return nil, exitOK, true
	}
	if fs.NArg() > c.maxArgs {
		fmt.Fprintf(stderr, "rte %s: takes at most %d argument(s), got %q\n\n", name, c.maxArgs, fs.Args())
		fs.Usage()
		return nil, exitSettings, true
	}
	return fs.Args(), exitOK, false
}

// Exit statuses: 2 for bad settings or usage, so a supervisor can tell them from a crash.
const (
	exitOK       = 0
	exitFailure  = 1
	exitSettings = 2
)

// run is the whole program behind main, with its inputs passed in so tests can drive it.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "--version", "-v":
		cmd = "version"
	case "--help", "-h":
		cmd = "help"
	}
	if _, ok := commands[cmd]; !ok {
		fmt.Fprintf(stderr, "rte: unknown command %q\n\n%s", cmd, usage)
		return exitSettings
	}
	pos, code, done := parseCommand(cmd, args, stdout, stderr)
	if done {
		return code
	}
	switch cmd {
	case "serve":
		return serve(ctx, environ, stderr, sigs)
	case "check-config":
		return checkConfig(environ, stdout, stderr)
	case "fingerprint":
		return fingerprint(pos, environ, stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "rte %s (protocol %d)\n", buildVersion(), protocol.Version)
		return exitOK
	default: // help
		fmt.Fprint(stdout, usage)
		return exitOK
	}
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "localhost"
	}
	return h
}

// loadSettings reads and checks the settings, printing every problem on failure.
func loadSettings(environ []string, stderr io.Writer) (*config.Settings, bool) {
	s, err := config.Load(environ, hostname())
	if err != nil {
		printProblems(err, stderr)
		return nil, false
	}
	return s, true
}

func printProblems(err error, w io.Writer) {
	var p *config.Problems
	if !errors.As(err, &p) {
		fmt.Fprintf(w, "rte: settings: %v\n", err)
		return
	}
	fmt.Fprintf(w, "rte: the settings have %d problem(s); nothing was started:\n", len(p.List))
	for _, pr := range p.List {
		fmt.Fprintf(w, "  - %s\n", pr.String())
	}
}

// checkConfig prints what the RTE would run with, then the problems, if any: the settings'
// own and what serve would refuse in the files and folders they name (preflight). Settings
// come back filled as far as parsing got even when there are problems, so both can be shown.
func checkConfig(environ []string, stdout, stderr io.Writer) int {
	s, err := config.Load(environ, hostname())
	var problems []config.Problem
	if p := (*config.Problems)(nil); errors.As(err, &p) {
		problems = p.List
	} else if err != nil {
		printProblems(err, stderr)
		return exitSettings
	}
	if perr := absolutePaths(s); perr != nil {
		problems = append(problems, config.Problem{Var: "paths", Message: perr.Error()})
	} else {
		problems = append(problems, preflight(s)...)
	}

	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, e := range s.Effective() {
		fmt.Fprintf(tw, "%s\t%s\n", e.Var, e.Value)
	}
	_ = tw.Flush()
	for _, w := range s.Warnings() {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	if len(problems) > 0 {
		printProblems(&config.Problems{List: problems}, stderr)
		return exitSettings
	}
	fmt.Fprintln(stdout, "settings: ok")
	return exitOK
}

func fingerprint(args, environ []string, stdout, stderr io.Writer) int {
	certPath := ""
	if len(args) == 1 { // parseCommand allowed at most one
		certPath = args[0]
	}
	// The token fingerprint needs only RTE_TOKEN; other settings may be incomplete here.
	var token string
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "RTE_TOKEN="); ok {
			token = v
		}
	}
	if certPath == "" {
		certPath = "certificates/cert.pem"
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "HTTPS_CERT="); ok && v != "" {
				certPath = v
			}
		}
	}
	status := exitOK
	der, err := pinning.LoadCertificateFile(certPath)
	if err != nil {
		fmt.Fprintf(stderr, "rte fingerprint: %v\n", err)
		status = exitFailure
	} else {
		fmt.Fprintf(stdout, "certificate_file: %s\n", certPath)
		fmt.Fprintf(stdout, "certificate_fingerprint: %s\n", protocol.CertificateFingerprint(der))
		fmt.Fprintf(stdout, "certificate_sha256: %s\n", protocol.CertificateSHA256(der))
	}
	if token == "" {
		fmt.Fprintln(stdout, "token_fingerprint: (RTE_TOKEN is not set)")
	} else {
		fmt.Fprintf(stdout, "token_fingerprint: %s\n", protocol.TokenFingerprint(token))
	}
	return status
}
