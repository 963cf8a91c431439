package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/refapp/refapptest"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/protocol"
)

func TestCheckCommand(t *testing.T) {
	ta := refapptest.StartApp(t)
	rte := refapptest.JoinFakeOutbound(t, ta, "out1")

	code, stdout, stderr := runCLI(t, ta, "check", "--runner", "out1", "--target", "ssh://ansible@up1:2222", "--target", "up2", "--timeout", "2500ms")
	if code != ExitOK || !strings.Contains(stdout, "success: 2 of 2 targets connected") || !strings.Contains(stdout, "ansible@up1:2222") {
		t.Fatalf("check of hosts that connect: exit %d, want 0\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	c := rte.LastCheck(t)
	if c.TimeoutMS != 2500 || c.Targets[0] != (protocol.CheckTarget{Name: "ansible@up1:2222", Host: "up1", Port: 2222, User: "ansible", Transport: "ssh"}) ||
		c.Targets[1] != (protocol.CheckTarget{Name: "up2", Host: "up2", Transport: "ssh"}) {
		t.Fatalf("the runner got %+v, want the targets as the flags gave them", c)
	}

	code, stdout, stderr = runCLI(t, ta, "check", "--runner", "out1", "--target", "up1", "--target", "winrm://down1:5985")
	if code != ExitFailed || !strings.Contains(stdout, "failure: 1 of 2 targets connected") || !strings.Contains(stdout, "connection refused") {
		t.Fatalf("check with an unreachable host: exit %d, want %d\nstdout %s\nstderr %s", code, ExitFailed, stdout, stderr)
	}
	code, stdout, _ = runCLI(t, ta, "check", "--runner", "out1", "--target", "down1", "--json")
	var res api.CheckResponse
	if code != ExitFailed || json.Unmarshal([]byte(stdout), &res) != nil || res.Status != api.CheckFailure || len(res.Result) != 1 {
		t.Fatalf("check --json: exit %d, stdout %s; want %d and the app's JSON", code, stdout, ExitFailed)
	}

	code, _, stderr = runCLI(t, ta, "check", "--runner", "r1", "--target", "h")
	if code != ExitTrouble || !strings.Contains(stderr, "409") || !strings.Contains(stderr, "not connected") {
		t.Fatalf("check on a runner that is not connected: exit %d, stderr %s; want %d saying 409, not connected", code, stderr, ExitTrouble)
	}
}

func TestCheckCommandRefusals(t *testing.T) {
	ta := refapptest.StartApp(t)
	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"no runner", []string{"--target", "h"}, "--runner NAME is required"},
		{"no target", []string{"--runner", "r1"}, "--target is required"},
		{"timeout too long", []string{"--runner", "r1", "--target", "h", "--timeout", "2m"}, "--timeout 2m0s"},
		{"unknown scheme", []string{"--runner", "r1", "--target", "telnet://h"}, "neither ssh:// nor winrm://"},
		{"password", []string{"--runner", "r1", "--target", "ssh://root:secret@h"}, "carries a password"},
		{"winrm user", []string{"--runner", "r1", "--target", "winrm://admin@h"}, "does not use"},
		{"bad port", []string{"--runner", "r1", "--target", "h:99999"}, "port \"99999\""},
		{"path", []string{"--runner", "r1", "--target", "ssh://h/x"}, "path"},
		{"no host", []string{"--runner", "r1", "--target", "ssh://:22"}, "no host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(t, ta, append([]string{"check"}, tc.args...)...)
			if code != ExitUsage || !strings.Contains(stderr, tc.says) {
				t.Fatalf("rte-app check %q: exit %d, stderr %q; want %d saying %q", tc.args, code, stderr, ExitUsage, tc.says)
			}
			if strings.Contains(stderr, "secret") {
				t.Fatalf("the password reached the error: %q", stderr)
			}
		})
	}
}

// FuzzParseTarget: a target the CLI takes is one the protocol takes, and never carries a
// password into the request.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"ssh://ansible@10.0.4.11:22", "winrm://h:5985", "root@h", "h:22", "ssh://u:p@h", "[::1]:22", "ssh://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := parseTarget(raw)
		if err != nil {
			if red := redactTarget(raw); strings.Contains(raw, ":secret@") && strings.Contains(red, "secret") {
				t.Fatalf("the refusal shows %q, with the password", red)
			}
			return
		}
		if err := (protocol.Check{ID: "fuzz", Targets: []protocol.CheckTarget{tg}}).Validate(); err != nil {
			t.Fatalf("parseTarget(%q) = %+v, which the protocol refuses: %v", raw, tg, err)
		}
	})
}
