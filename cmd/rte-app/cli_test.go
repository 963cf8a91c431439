package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/refapptest"
)

func TestCommandLineRefusals(t *testing.T) {
	ta := refapptest.StartApp(t)
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  []string // replaces the test app's environment when set
		code int
		want string
	}{
		{"no command", nil, nil, cli.ExitUsage, "usage: rte-app"},
		{"unknown command", []string{"frobnicate"}, nil, cli.ExitUsage, `unknown command "frobnicate"`},
		{"run without runner and playbook", []string{"run"}, nil, cli.ExitUsage, "--runner NAME and --playbook FILE required"},
		{"run without playbook", []string{"run", "--runner", "r1"}, nil, cli.ExitUsage, "--playbook FILE required"},
		{"run with a stray argument", []string{"run", "--runner", "r1", "--playbook", "a.yml", "extra"}, nil, cli.ExitUsage, "takes no arguments"},
		{"extra vars not an object", []string{"run", "--runner", "r1", "--playbook", "a.yml", "--extra-vars", "[1]"}, nil, cli.ExitUsage, "--extra-vars: want a JSON object"},
		{"extra vars file missing", []string{"run", "--runner", "r1", "--playbook", "a.yml", "--extra-vars", "@/nonexistent"}, nil, cli.ExitUsage, "--extra-vars: open /nonexistent"},
		{"env without value", []string{"run", "--runner", "r1", "--playbook", "a.yml", "--env", "K"}, nil, cli.ExitUsage, `--env "K": want NAME=VALUE`},
		{"empty password file", []string{"run", "--runner", "r1", "--playbook", "a.yml", "--vault-password-file", empty}, nil, cli.ExitUsage, "is empty"},
		{"unknown flag", []string{"run", "--frob"}, nil, cli.ExitUsage, "flag provided but not defined: -frob"},
		{"approve without name", []string{"approve"}, nil, cli.ExitUsage, "want one runner NAME argument"},
		{"follow two jobs", []string{"follow", "a", "b"}, nil, cli.ExitUsage, "want one JOB argument, got 2"},
		{"no admin token", []string{"runners"}, []string{"APP_URL=" + ta.URL}, cli.ExitUsage, "APP_ADMIN_TOKEN is not set"},
		{"bad app url", []string{"runners", "--app", "ftp://x"}, []string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken}, cli.ExitUsage, `--app "ftp://x" is not an http://`},
		{"wrong admin token", []string{"runners"}, []string{"APP_URL=" + ta.URL, "APP_ADMIN_TOKEN=wrong-token-0123456789"}, cli.ExitTrouble, "401 Unauthorized: wrong admin token"},
		{"app not running", []string{"runners", "--app", "http://127.0.0.1:1"}, []string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken}, cli.ExitTrouble, "is the app running at http://127.0.0.1:1?"},
		{"unknown job", []string{"follow", "nope"}, nil, cli.ExitTrouble, `no job "nope"`},
		{"unknown runner", []string{"run", "--runner", "nope", "--playbook", "a.yml"}, nil, cli.ExitTrouble, `runner: no runner named "nope"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env
			if env == nil {
				env = []string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_URL=" + ta.URL}
			}
			var stdout, stderr refapptest.SyncBuffer
			code := run(context.Background(), tc.args, env, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("rte-app %q: exit %d, want %d with %q in:\n%s", tc.args, code, tc.code, tc.want, stderr.String())
			}
		})
	}
}
