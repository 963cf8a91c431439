package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's main command's core, `rte-app demo`, as a person would: the
// reference app and a real RTE over TLS with a pinned certificate, a real playbook on
// localhost and, as root, on a second host over a real sshd on loopback. It checks what the
// demo promises to show: matching fingerprints, the output, the summary and success.
func TestDemo(t *testing.T) {
	if _, err := os.Stat("/usr/sbin/sshd"); err != nil || os.Geteuid() != 0 {
		t.Log("running without the ssh host: needs root and /usr/sbin/sshd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	examples, _ := filepath.Abs("../examples")
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "rte-app"), "demo",
		"--rte", filepath.Join(binDir, "rte"), "--examples", examples)
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	text := string(out)
	if err != nil {
		t.Fatalf("rte-app demo: %v\n%s", err, text)
	}
	for _, want := range []string{
		"same", "PLAY RECAP", "Hosts and tasks", "RECAP", ": success",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if strings.Contains(text, "DIFFERENT") {
		t.Errorf("the demo reports fingerprints that differ")
	}
	if t.Failed() {
		t.Logf("demo output:\n%s", text)
	}
}
