package jobs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// engine runs a job's ansible-playbook: a process group on this host (processEngine, the
// default) or a container per job (dockerEngine). Everything above it (records, batching,
// masking, cancel, timeout, drain) is the same for every engine: the runner sees only the two
// read ends it returns and the running handle.
type engine interface {
	// ready reports whether a job could start now in image ("" for the default); nil when it
	// could. Start refuses a job while it returns an error, and /ready shows it. It must be
	// quick.
	ready(ctx context.Context, image string) error
	// pluginDir is the af_events plugin directory as ansible-playbook sees it, for the job
	// whose private directory is p; an engine that cannot see the RTE's copy puts one there.
	pluginDir(p private) (string, error)
	// secretDir is where ansible-playbook reads the job's secret files when the engine hands
	// them over itself, never on the RTE's disk (a tmpfs of the job's container); "" when they
	// are 0600 files in the job's private directory.
	secretDir() string
	// start runs l. out carries stdout and stderr in order, events the plugin's fd 3; both
	// reach EOF once everything of the job that held them has exited. The error text is the
	// end record's message.
	start(ctx context.Context, l launch) (r running, out, events *os.File, err error)
	// close releases the engine's connections; no job runs any more.
	close() error
}

// launch is what the runner hands an engine: the command and where it runs.
type launch struct {
	job    string
	jobDir string // the job's private directory
	priv   private
	image  string // the job's image, "" for the default; only containers have one
	binary string
	args   []string
	env    []string
	dir    string // working directory
}

// running is one started job's ansible-playbook, whatever runs it. The runner calls wait once,
// and stop from another goroutine once the job's context ends.
type running interface {
	pid() int
	// exited is closed once wait has seen the playbook's end.
	exited() <-chan struct{}
	// wait blocks until the playbook has ended, and nothing of it runs any more.
	wait() error
	// status is how it ended; known is false before wait returns or when waiting failed.
	status() exitStatus
	// stop asks it to end (SIGTERM), then kills it after grace; killed reports the latter.
	stop(grace time.Duration) (killed bool)
	wasSignaled() bool
	// what names what stop signals, for the job's log records: "process group", "container".
	what() string
}

// exitStatus is how a playbook ended: its exit code, 128+signal when a signal ended it (the
// shell's convention), -1 when unknown.
type exitStatus struct {
	known  bool
	code   int
	signal syscall.Signal // non-zero when a signal ended it
	// note is what the engine saw beside the exit status (a container that hit its memory
	// limit), added to the end message of a failed job; "" for process groups.
	note string
}

// processEngine runs each job as a process group under the RTE's own user (group.go).
type processEngine struct{ pluginPath string }

func (processEngine) ready(context.Context, string) error { return nil }

func (processEngine) close() error { return nil }

func (processEngine) secretDir() string { return "" }

func (e processEngine) pluginDir(private) (string, error) { return e.pluginPath, nil }

func (processEngine) start(_ context.Context, l launch) (running, *os.File, *os.File, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("make output pipe: %v", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, nil, fmt.Errorf("make events pipe: %v", err)
	}
	cmd := &exec.Cmd{
		Path:       l.binary,
		Args:       append([]string{l.binary}, l.args...),
		Env:        l.env,
		Dir:        l.dir,
		Stdout:     outW, // one pipe for both keeps their order
		Stderr:     outW,
		ExtraFiles: []*os.File{evW}, // fd 3, eventsFD
	}
	g, err := startGroup(cmd)
	// The child has its copies; without closing ours, the pipes never reach EOF.
	outW.Close()
	evW.Close()
	if err != nil {
		outR.Close()
		evR.Close()
		return nil, nil, nil, fmt.Errorf("start %s: %v", l.binary, err)
	}
	return g, outR, evR, nil
}
