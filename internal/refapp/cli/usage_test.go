package cli

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/refapp/refapptest"
)

// TestRunTakesAnsiblePlaybookFlags submits with ansible-playbook's short flags to a real app
// and reads the stored job back.
func TestRunTakesAnsiblePlaybookFlags(t *testing.T) {
	ta := refapptest.StartApp(t)
	code, stdout, stderr := runCLI(t, ta, "run", "--runner", "r1", "--playbook", "site.yml",
		"-i", "hosts.yml", "-i", "more.yml", "-e", `{"x":1}`, "-l", "web*", "-t", "a,b", "-vvv", "--no-follow")
	if code != ExitOK {
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
