package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/internal/logging"
	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/demo"
	"github.com/rte-project/rte/internal/refapp/server"
	"github.com/rte-project/rte/internal/refapp/settings"
	"go.uber.org/zap"
)

const usage = `rte-app is the RTE project's reference app: the demo, the peer of the end-to-end tests and
the example for app authors, not a product to run in production.

usage: rte-app <command> [flags]     (rte-app <command> --help for its flags)

server:
  serve                 run the app: registration, admin API, dispatch (settings from the environment)

commands that talk to a running app (flags: --app URL, default $APP_URL or http://127.0.0.1:8080;
the admin token comes from APP_ADMIN_TOKEN):
  runners               list runners with their fingerprints and connection
  approve NAME          approve a runner (--sha256 HEX: only the certificate with that full SHA-256;
                        --fingerprint abcd-ef12: only if that certificate waits)
  reject NAME           reject and remove a runner (--reason TEXT)
  clear-waiting         reject every registration request still waiting for an admin (--reason TEXT)
  run                   run a playbook and follow it: --runner NAME --playbook site.yml
                        [--inventory hosts.yml ...] [--extra-vars JSON|@file] [--limit PATTERN]
                        [--tags a,b] [--skip-tags c] [--check] [--diff] [-v N] [--forks N]
                        [--env K=V ...] [--vault-password-file F] [--become-password-file F]
                        [--timeout SECONDS] [--no-follow]
  follow JOB            follow a job from its first record to its end
  jobs                  list jobs (--runner NAME, --state queued,running, --limit N)
  cancel JOB            cancel a job
  check                 can the runner reach these hosts now? --runner NAME
                        --target ssh://[user@]host[:port] [--target winrm://host[:port] ...]
                        [--timeout 5s] [--json]; exit 0 when all connected, 4 when not

demo:
  demo                  the app, a real RTE over TLS and a real playbook on this machine
                        [--rte PATH] [--examples DIR] [--ssh=true|false] [--verbose]

  help                  print this text

Exit status: 0 success; 1 rte-app could not do what was asked; 2 bad usage or settings (nothing
was done); 3 the job was canceled, timed out, was abandoned or hit an error; 4 the playbook
failed, or a target of check did not connect.
docs/reference-app.md has the details.
`

// run is the whole program behind main, with its inputs passed in so tests can drive it.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.ExitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, args, environ, stdout, stderr)
	case "runners", "approve", "reject", "clear-waiting", "run", "follow", "jobs", "cancel", "check":
		return cli.Run(ctx, cmd, args, environ, stdout, stderr)
	case "demo":
		return demo.Run(ctx, args, environ, stdout, stderr)
	case "help", "--help", "-h":
		if err := cli.NoArgs(cli.NewFlagSet("help", stdout, stderr), args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return cli.ExitOK
			}
			return cli.ExitUsage
		}
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	default:
		fmt.Fprintf(stderr, "rte-app: unknown command %s\n\n%s", config.Quote(cmd), usage)
		return cli.ExitUsage
	}
}

// serve is `rte-app serve`: it takes no arguments, reads and checks the settings, builds the
// logger and runs the app (package server) until ctx ends.
func serve(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	if err := cli.NoArgs(cli.NewFlagSet("serve", stdout, stderr), args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cli.ExitOK
		}
		return cli.ExitUsage // NoArgs printed why and the usage
	}
	s, err := settings.Load(environ, settings.Hostname())
	if err != nil {
		var problems *config.Problems
		if errors.As(err, &problems) {
			fmt.Fprintf(stderr, "rte-app serve: the settings have %d problem(s); nothing was started:\n", len(problems.List))
			for _, p := range problems.List {
				fmt.Fprintf(stderr, "  - %s\n", p)
			}
		} else {
			fmt.Fprintf(stderr, "rte-app serve: %v\n", err)
		}
		return cli.ExitUsage
	}
	logger, err := logging.New(s.LogLevel, s.LogFormat, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rte-app serve: logger: %v\n", err)
		return cli.ExitUsage
	}
	defer func() { _ = logger.Sync() }()
	if err := server.Run(ctx, s, logger); err != nil {
		logger.Error("rte-app stopped", zap.Error(err))
		return cli.ExitTrouble
	}
	logger.Info("rte-app stopped")
	return cli.ExitOK
}
