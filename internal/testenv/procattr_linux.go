package testenv

import "syscall"

// OwnGroupTiedToParent is the process attributes of a child that must not outlive its parent
// nor see the terminal's Ctrl-C: its own process group, so Ctrl-C reaches only the parent,
// which stops its children in order; and SIGTERM from the kernel if the parent dies without
// stopping it. The demo starts sshd and the RTE with these.
func OwnGroupTiedToParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
