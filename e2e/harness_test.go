package e2e

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rte-project/rte/internal/testenv"
)

// binDir holds the binaries built once for the whole package.
var binDir string

func TestMain(m *testing.M) {
	// Every test here builds and runs the real binaries with real ansible: none belongs in the
	// -short inner loop. testing.Short needs the flags parsed first.
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode (the real binaries, ansible, sshd)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "rte-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := func() int {
		defer os.RemoveAll(dir)
		defer stopPostgres()       // pgstore_test.go
		defer testenv.StopPodman() // engine_test.go
		if err := testenv.Build(dir, "..", raceEnabled, "rte", "rte-app"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// freePort asks the kernel for a loopback port that is free now.
func freePort(t testing.TB) int {
	t.Helper()
	return testenv.MustFreePort(t)
}

// rteProc is one running rte binary with its log lines captured.
type rteProc = testenv.RTE

// startRTE runs the rte binary in dir with env (on top of a minimal base) and waits for /live.
func startRTE(t testing.TB, dir string, port int, env ...string) *rteProc {
	t.Helper()
	return testenv.StartRTE(t, filepath.Join(binDir, "rte"), dir, port, env...)
}

// runRTE runs the rte binary to completion (subcommands) and returns output and exit code.
func runRTE(t *testing.T, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	return testenv.RunRTE(t, filepath.Join(binDir, "rte"), dir, env, args...)
}
