package demo

import "syscall"

// childAttr puts a demo child (the RTE, sshd) in its own process group, so the terminal's
// Ctrl-C reaches only rte-app, which stops the children in order; and has the kernel send it
// SIGTERM if rte-app dies without stopping it, so no child outlives the demo.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
