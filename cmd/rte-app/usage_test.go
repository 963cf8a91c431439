package main

import (
	"context"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/refapp/cli"
	"github.com/rte-project/rte/internal/refapp/refapptest"
)

// TestEveryCommandAnswersHelp runs each command with -h and --help (usage on stdout, exit 0,
// nothing started), with an unknown flag and with a stray argument (usage on stderr, exit 2).
func TestEveryCommandAnswersHelp(t *testing.T) {
	// No app runs here: a command that tried to reach one, or serve that opened a listener,
	// would fail differently (exit 1) or not return.
	env := []string{"APP_ADMIN_TOKEN=" + refapptest.AdminToken, "APP_URL=http://127.0.0.1:1", "APP_LISTEN=127.0.0.1:1"}
	takesArgs := map[string]bool{"approve": true, "reject": true, "follow": true, "cancel": true}
	for _, name := range cli.Commands() {
		t.Run(name, func(t *testing.T) {
			for _, h := range []string{"-h", "--help", "-help"} {
				var stdout, stderr refapptest.SyncBuffer
				code := run(context.Background(), []string{name, h}, env, &stdout, &stderr)
				if code != cli.ExitOK || !strings.HasPrefix(stdout.String(), "usage: rte-app "+name) || stderr.String() != "" {
					t.Errorf("rte-app %s %s: exit %d, want 0 with the usage on stdout\nstdout %s\nstderr %s", name, h, code, stdout.String(), stderr.String())
				}
			}
			var stdout, stderr refapptest.SyncBuffer
			code := run(context.Background(), []string{name, "--bogus"}, env, &stdout, &stderr)
			if code != cli.ExitUsage || !strings.Contains(stderr.String(), "flag provided but not defined: -bogus") ||
				!strings.Contains(stderr.String(), "usage: rte-app "+name) || stdout.String() != "" {
				t.Errorf("rte-app %s --bogus: exit %d, want %d with the usage on stderr\nstdout %s\nstderr %s", name, code, cli.ExitUsage, stdout.String(), stderr.String())
			}
			if takesArgs[name] {
				return
			}
			stdout, stderr = refapptest.SyncBuffer{}, refapptest.SyncBuffer{}
			code = run(context.Background(), []string{name, "stray"}, env, &stdout, &stderr)
			if code != cli.ExitUsage || !strings.Contains(stderr.String(), "takes no arguments") || !strings.Contains(stderr.String(), "usage: rte-app "+name) {
				t.Errorf("rte-app %s stray: exit %d, want %d with the usage on stderr\nstderr %s", name, code, cli.ExitUsage, stderr.String())
			}
		})
	}
	for _, h := range []string{"-h", "--help", "help"} {
		var stdout, stderr refapptest.SyncBuffer
		code := run(context.Background(), []string{h}, env, &stdout, &stderr)
		first, _, _ := strings.Cut(stdout.String(), "\n")
		if code != cli.ExitOK || !strings.Contains(first, "reference app") || !strings.Contains(stdout.String(), "usage: rte-app <command>") {
			t.Errorf("rte-app %s: exit %d, want 0 and a first line saying it is the reference app:\n%s", h, code, stdout.String())
		}
	}
}
