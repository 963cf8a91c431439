package deploy_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	unitFile = "systemd/rte.service"
	envFile  = "systemd/rte.env"
)

// buildRTE builds the rte binary into a temporary directory and returns its path.
func buildRTE(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: this test builds the rte binary")
	}
	bin := filepath.Join(t.TempDir(), "rte")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/rte")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/rte: %v\n%s", err, out)
	}
	return bin
}

// verifyUnit runs systemd-analyze verify on the unit's text, with ExecStart pointing at bin
// (verify wants the program to exist), and returns what it printed and whether it exited 0.
func verifyUnit(t *testing.T, unit, bin string) (string, bool) {
	t.Helper()
	text := strings.ReplaceAll(unit, "ExecStart=/usr/local/bin/rte ", "ExecStart="+bin+" ")
	if text == unit {
		t.Fatalf("%s has no ExecStart=/usr/local/bin/rte line to point at the built binary", unitFile)
	}
	path := filepath.Join(t.TempDir(), "rte.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	return string(out), err == nil
}

// TestSystemdUnitVerifies checks deploy/systemd/rte.service with systemd-analyze verify: no
// error and no warning (an unknown or misspelt key is only a warning, and would silently drop
// a sandboxing option).
func TestSystemdUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("TestSystemdUnitVerifies not run: systemd-analyze is not installed (Debian package systemd)")
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	bin := buildRTE(t)
	if out, ok := verifyUnit(t, string(unit), bin); !ok || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify %s: exit 0 %v, output:\n%s\nwant exit 0 and no output", unitFile, ok, out)
	}
	// The same check must see a mistake, or the pass above says nothing.
	bad := strings.Replace(string(unit), "ProtectSystem=strict", "ProtectSystem=strict\nProtectSistem=strict", 1)
	if out, ok := verifyUnit(t, bad, bin); ok && !strings.Contains(out, "ProtectSistem") {
		t.Fatalf("systemd-analyze verify did not report a misspelt key; output:\n%s", out)
	}
}

// readKeyValues reads KEY=value lines (the unit's, or the environment file's), skipping
// comments and section headers; a key given twice keeps its last value.
func readKeyValues(t *testing.T, path string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=value", path, line)
		}
		kv[k] = v
	}
	return kv
}

// TestSystemdStopCoversDrain checks that systemd waits longer for a stop than the RTE drains:
// RTE_DRAIN_SECONDS, then 10 s until SIGKILL of the jobs' groups, then the end records
// written. With a shorter TimeoutStopSec systemd would kill the RTE mid-drain.
func TestSystemdStopCoversDrain(t *testing.T) {
	unit, env := readKeyValues(t, unitFile), readKeyValues(t, envFile)
	if unit["KillSignal"] != "SIGTERM" {
		t.Errorf("KillSignal=%q, want SIGTERM: it is the signal that starts the drain", unit["KillSignal"])
	}
	stop, err := time.ParseDuration(unit["TimeoutStopSec"])
	if err != nil {
		t.Fatalf("TimeoutStopSec=%q: %v", unit["TimeoutStopSec"], err)
	}
	drain, err := strconv.Atoi(env["RTE_DRAIN_SECONDS"])
	if err != nil {
		t.Fatalf("%s: RTE_DRAIN_SECONDS=%q: %v", envFile, env["RTE_DRAIN_SECONDS"], err)
	}
	if need := time.Duration(drain+10+5) * time.Second; stop < need {
		t.Errorf("TimeoutStopSec %s is shorter than RTE_DRAIN_SECONDS %d s + 10 s escalation + 5 s (%s)", stop, drain, need)
	}
	if unit["User"] == "" || unit["User"] == "root" {
		t.Errorf("User=%q: the RTE needs a dedicated user", unit["User"])
	}
}

// TestSystemdEnvFileIsAccepted gives the RTE exactly the environment file's settings and runs
// rte check-config: the file an operator copies must start an RTE once its values are theirs.
func TestSystemdEnvFileIsAccepted(t *testing.T) {
	env := readKeyValues(t, envFile)
	bin := buildRTE(t)
	cmd := exec.Command(bin, "check-config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("rte check-config with %s: %v\n%s", envFile, err, out)
	}
	if !strings.Contains(string(out), "RTE_DRAIN_SECONDS") {
		t.Fatalf("rte check-config printed no settings:\n%s", out)
	}
}
