package jobs_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/internal/testenv"
)

// fakeChildEnv switches the test binary into a fake ansible-playbook, for the corners a real
// one cannot reach (it ignores SIGTERM, writes at a chosen pace or volume). Tests pass it in
// the job's env, the only way anything reaches the child.
const fakeChildEnv = "JOBS_FAKE_CHILD"

// Values the RTE process has in its environment that no job may see.
const (
	leakToken   = "rte-token-must-not-leak-8d1f0c"
	leakMetrics = "metrics-token-must-not-leak-77aa"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeChildEnv); mode != "" {
		os.Exit(fakeChild(mode, os.Args[1:]))
	}
	// Every test runs with these set, so any job that inherited the RTE's environment would
	// show them; TestEnvironmentIsOnlyWhatIsGiven looks for them.
	os.Setenv("RTE_TOKEN", leakToken)
	os.Setenv("METRICS_TOKEN", leakMetrics)
	// The podman tests' service, if one started, ends with the binary (goleak's check calls
	// os.Exit, so it runs before that, through the cleanup hook).
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { testenv.StopPodman(); os.Exit(code) }))
}

// fakeChild plays ansible-playbook; args are the command line the Manager built.
func fakeChild(mode string, args []string) int {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	switch mode {
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		time.Sleep(time.Hour)
	case "sleep":
		fmt.Println("sleeping")
		time.Sleep(time.Hour)
	case "flood":
		// JOBS_FAKE_BYTES of ansible-like lines, then exit 0.
		n, _ := strconv.Atoi(os.Getenv("JOBS_FAKE_BYTES"))
		line := []byte("ok: [web-01.example.com] => (item=package-name-0001) changed=false msg=all good\n")
		for written := 0; written < n; written += len(line) {
			out.Write(line)
		}
	case "args":
		// Prints the command line and what each password file holds (as a hash: its value
		// would be masked), then writes the become password in two halves with a pause, to
		// stdout and as a JSON event to fd 3, so the halves land in different reads.
		fmt.Fprintf(out, "args: %s\n", strings.Join(args, " "))
		var become string
		for _, a := range args {
			opt, path, ok := strings.Cut(a, "=")
			if !ok || !strings.HasSuffix(opt, "-file") && opt != "--extra-vars" {
				continue
			}
			path = strings.TrimPrefix(path, "@")
			fi, err := os.Stat(path)
			if err != nil {
				fmt.Fprintf(out, "%s: %v\n", opt, err)
				return 1
			}
			b, _ := os.ReadFile(path)
			sum := sha256.Sum256(b)
			fmt.Fprintf(out, "file %s mode %o sha256 %s\n", opt, fi.Mode().Perm(), hex.EncodeToString(sum[:]))
			if opt == "--become-password-file" {
				become = string(b)
			}
		}
		out.Flush()
		half := len(become) / 2
		events := os.NewFile(3, "events")
		fmt.Fprintf(os.Stdout, "split secret: [%s", become[:half])
		fmt.Fprintf(events, `{"event":"runner_on_ok","counter":1,"event_data":{"res":{"msg":"%s`, become[:half])
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintf(os.Stdout, "%s] done\n", become[half:])
		fmt.Fprintf(events, "%s\"}}}\n", become[half:])
	default:
		fmt.Fprintf(os.Stderr, "unknown %s %q\n", fakeChildEnv, mode)
		return 3
	}
	return 0
}
