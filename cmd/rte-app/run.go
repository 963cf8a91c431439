package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
		return exitUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, args, environ, stdout, stderr)
	case "runners", "approve", "reject", "clear-waiting", "run", "follow", "jobs", "cancel", "check":
		return cli(ctx, cmd, args, environ, stdout, stderr)
	case "demo":
		return demo(ctx, args, environ, stdout, stderr)
	case "help", "--help", "-h":
		if err := noArgs(newFlagSet("help", stdout, stderr), args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "rte-app: unknown command %s\n\n%s", quote(cmd), usage)
		return exitUsage
	}
}

// newLogger builds the one logger of the process: JSON lines for machines, or console text.
