package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestEveryCommandAnswersHelp runs each command with -h and --help (usage on stdout, exit 0,
// nothing started), with an unknown flag and with a stray argument (usage on stderr, exit 2).
func TestEveryCommandAnswersHelp(t *testing.T) {
	// No app runs here: a command that tried to reach one, or serve that opened a listener,
	// would fail differently (exit 1) or not return.
	env := []string{"APP_ADMIN_TOKEN=" + testAdminToken, "APP_URL=http://127.0.0.1:1", "APP_LISTEN=127.0.0.1:1"}
	takesArgs := map[string]bool{"approve": true, "reject": true, "follow": true, "cancel": true}
	for name := range commandHelp {
		t.Run(name, func(t *testing.T) {
			for _, h := range []string{"-h", "--help", "-help"} {
				var stdout, stderr syncBuffer
				code := run(context.Background(), []string{name, h}, env, &stdout, &stderr)
				if code != exitOK || !strings.HasPrefix(stdout.String(), "usage: rte-app "+name) || stderr.String() != "" {
					t.Errorf("rte-app %s %s: exit %d, want 0 with the usage on stdout\nstdout %s\nstderr %s", name, h, code, stdout.String(), stderr.String())
				}
			}
			var stdout, stderr syncBuffer
			code := run(context.Background(), []string{name, "--bogus"}, env, &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), "flag provided but not defined: -bogus") ||
				!strings.Contains(stderr.String(), "usage: rte-app "+name) || stdout.String() != "" {
				t.Errorf("rte-app %s --bogus: exit %d, want %d with the usage on stderr\nstdout %s\nstderr %s", name, code, exitUsage, stdout.String(), stderr.String())
			}
			if takesArgs[name] {
				return
			}
			stdout, stderr = syncBuffer{}, syncBuffer{}
			code = run(context.Background(), []string{name, "stray"}, env, &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), "takes no arguments") || !strings.Contains(stderr.String(), "usage: rte-app "+name) {
				t.Errorf("rte-app %s stray: exit %d, want %d with the usage on stderr\nstderr %s", name, code, exitUsage, stderr.String())
			}
		})
	}
	for _, h := range []string{"-h", "--help", "help"} {
		var stdout, stderr syncBuffer
		code := run(context.Background(), []string{h}, env, &stdout, &stderr)
		first, _, _ := strings.Cut(stdout.String(), "\n")
		if code != exitOK || !strings.Contains(first, "reference app") || !strings.Contains(stdout.String(), "usage: rte-app <command>") {
			t.Errorf("rte-app %s: exit %d, want 0 and a first line saying it is the reference app:\n%s", h, code, stdout.String())
		}
	}
}

// TestRunTakesAnsiblePlaybookFlags submits with ansible-playbook's short flags to a real app
// and reads the stored job back.
func TestRunTakesAnsiblePlaybookFlags(t *testing.T) {
	ta := startTestApp(t)
	code, stdout, stderr := ta.runCLI(t, "run", "--runner", "r1", "--playbook", "site.yml",
		"-i", "hosts.yml", "-i", "more.yml", "-e", `{"x":1}`, "-l", "web*", "-t", "a,b", "-vvv", "--no-follow")
	if code != exitOK {
		t.Fatalf("run: exit %d, stderr %s", code, stderr)
	}
	j, err := ta.App.GetJob(context.Background(), strings.TrimSpace(stdout))
	if err != nil {
		t.Fatal(err)
	}
	var vars map[string]int
	s := j.Start
	if !slices.Equal(s.Inventories, []string{"hosts.yml", "more.yml"}) || json.Unmarshal(s.Extravars, &vars) != nil || vars["x"] != 1 ||
		s.Limit != "web*" || !slices.Equal(s.Tags, []string{"a", "b"}) || s.Verbosity != 3 {
		t.Errorf("stored job: inventories %q extravars %s limit %q tags %q verbosity %d; want hosts.yml more.yml, {\"x\":1}, web*, a b, 3",
			s.Inventories, s.Extravars, s.Limit, s.Tags, s.Verbosity)
	}
}

func TestVerbosityArgs(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"-v"}, []string{"-v=1"}},
		{[]string{"-vvvvvv", "--runner", "r"}, []string{"-v=6", "--runner", "r"}},
		{[]string{"-v", "2"}, []string{"-v", "2"}},                        // the long-standing -v N
		{[]string{"-v", "--check"}, []string{"-v=1", "--check"}},          // -v alone before a flag
		{[]string{"-vvvvvvv"}, []string{"-vvvvvvv"}},                      // beyond 6: left for the flag package to refuse
		{[]string{"--", "-vv"}, []string{"--", "-vv"}},                    // after --, nothing is a flag
		{[]string{"--limit", "-vx"}, []string{"--limit", "-vx"}},          // not only v's
		{[]string{"--tags", "v", "-vv"}, []string{"--tags", "v", "-v=2"}}, // a bare word is no flag
	}
	for _, tc := range cases {
		if got := verbosityArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("verbosityArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
