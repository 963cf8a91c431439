package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/rte-project/rte/config"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// version is set at build time with -ldflags "-X main.version=1.2.3"; a plain go build says
// which module version or commit it came from.
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return strings.TrimPrefix(bi.Main.Version, "v")
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "0.0.0-" + s.Value[:12]
			}
		}
	}
	return "0.0.0-dev"
}

const usage = `usage: rte [command]

commands:
  serve            run the RTE (the default when no command is given)
  check-config     print the effective settings (secrets redacted) and any problems; exit 0 or 2
  fingerprint [CERT]
                   print the certificate fingerprints of HTTPS_CERT (or CERT) and the token fingerprint
  version          print the version
  help             print this text

Settings come from the environment; docs/settings.md lists them.
`

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
	case "serve":
		return serve(ctx, environ, stderr, sigs)
	case "check-config":
		return checkConfig(environ, stdout, stderr)
	case "fingerprint":
		return fingerprint(args, environ, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "rte %s (protocol %d)\n", buildVersion(), protocol.Version)
		return exitOK
	case "help", "--help", "-h":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "rte: unknown command %q\n\n%s", cmd, usage)
		return exitSettings
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

// checkConfig prints what the RTE would run with, then the problems, if any. Settings come
// back filled as far as parsing got even when there are problems, so both can be shown.
func checkConfig(environ []string, stdout, stderr io.Writer) int {
	s, err := config.Load(environ, hostname())
	if s != nil {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, e := range s.Effective() {
			fmt.Fprintf(tw, "%s\t%s\n", e.Var, e.Value)
		}
		_ = tw.Flush()
		for _, w := range s.Warnings() {
			fmt.Fprintf(stdout, "warning: %s\n", w)
		}
	}
	if err != nil {
		printProblems(err, stderr)
		return exitSettings
	}
	fmt.Fprintln(stdout, "settings: ok")
	return exitOK
}

func fingerprint(args, environ []string, stdout, stderr io.Writer) int {
	certPath := ""
	if len(args) > 1 {
		fmt.Fprintf(stderr, "rte fingerprint: want at most one certificate file, got %d arguments\n", len(args))
		return exitSettings
	}
	if len(args) == 1 {
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
