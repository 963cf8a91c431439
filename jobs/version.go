package jobs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"github.com/rte-project/rte/protocol"
)

// ansible-core prints "ansible-playbook [core 2.14.18]"; releases before 2.10 printed
// "ansible-playbook 2.9.27".
var versionLine = regexp.MustCompile(`^\S+\s+(?:\[core\s+([^\]\s]+)\]|([0-9][^\s]*))`)

// AnsibleVersion runs `binary --version` and returns the version it reports, such as
// "2.14.18", for the hello message.
func AnsibleVersion(ctx context.Context, binary string) (string, error) {
	if binary == "" {
		binary = DefaultAnsiblePlaybook
	}
	cmd := exec.CommandContext(ctx, binary, "--version")
	// Only what ansible needs to start: none of the RTE's settings or tokens.
	cmd.Env = []string{}
	for _, k := range []string{"PATH", "HOME", "LANG", "LC_ALL"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w (is ansible-core installed?)", binary, err)
	}
	return parseVersion(binary, out)
}

// parseVersion reads the version from the first line of --version's output.
func parseVersion(binary string, out []byte) (string, error) {
	first, _, _ := bytes.Cut(out, []byte("\n"))
	m := versionLine.FindSubmatch(bytes.TrimSpace(first))
	if m == nil {
		return "", fmt.Errorf("%s --version printed %q, which names no version", binary, protocol.PeerText(strings.TrimSpace(string(first)), 120))
	}
	if len(m[1]) > 0 {
		return string(m[1]), nil
	}
	return string(m[2]), nil
}
