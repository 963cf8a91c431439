package jobs

import "golang.org/x/sys/unix"

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
