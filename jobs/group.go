package jobs

import (
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// group is a running ansible-playbook and the process group it leads. It is the one place that
// starts, signals and waits for a job's processes; the runner uses it only through the running
// interface (engine.go), and never touches a pid itself, so another way of running the
// playbook (a container engine, docker.go) stands behind the same few calls without the record
// batching noticing.
//
// The group id stays ours while the leader is unreaped (a zombie keeps its pid), so signals go
// out only until then: never to a group id the kernel has handed to someone else.
type group struct {
	cmd     *exec.Cmd
	pgid    int
	exitedC chan struct{} // closed by wait once the leader has exited and been reaped

	mu       sync.Mutex // guards reaped and signaled
	reaped   bool
	signaled bool
}

// startGroup starts cmd as the leader of a new process group. cmd's other fields (path,
// arguments, environment, pipes) are the caller's.
func startGroup(cmd *exec.Cmd) (*group, error) {
	// Pdeathsig stops ansible-playbook if the RTE dies without stopping it; what it forked is
	// found again by KillLeftovers when the RTE restarts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &group{cmd: cmd, pgid: cmd.Process.Pid, exitedC: make(chan struct{})}, nil
}

// pid is the leader's process id.
func (g *group) pid() int { return g.pgid }

func (g *group) exited() <-chan struct{} { return g.exitedC }

func (g *group) what() string { return "process group" }

// status is how the leader ended; not known before wait returns, or when waiting failed.
func (g *group) status() exitStatus {
	state := g.cmd.ProcessState
	if state == nil {
		return exitStatus{code: -1}
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitStatus{known: true, code: 128 + int(ws.Signal()), signal: ws.Signal()}
	}
	return exitStatus{known: true, code: state.ExitCode()}
}

func (g *group) signal(sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reaped {
		return
	}
	g.signaled = true
	_ = syscall.Kill(-g.pgid, sig)
}

// wasSignaled reports whether stop sent the group a signal.
func (g *group) wasSignaled() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.signaled
}

// wait blocks until the leader exits, kills what it left in its group (nothing of a job
// outlives it), then reaps the leader and closes exited. It is called once.
func (g *group) wait() error {
	defer close(g.exitedC)
	if err := waitExited(g.pgid); err == nil {
		g.mu.Lock()
		if !g.reaped {
			_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		}
		g.mu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reaped = true
	return g.cmd.Wait()
}

// stop sends the group SIGTERM, then SIGKILL if the leader has not exited after grace. It
// returns once the leader has exited or SIGKILL is sent; killed reports the latter.
func (g *group) stop(grace time.Duration) (killed bool) {
	g.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-g.exitedC:
		return false
	case <-t.C:
	}
	g.signal(syscall.SIGKILL)
	return true
}

// waitExited blocks until process pid has exited, without reaping it: the zombie keeps the pid,
// and with it the process group id, from being reused while the group is still signaled.
func waitExited(pid int) error {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}
