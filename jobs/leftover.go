package jobs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// JobIDEnv names the job in the environment of every process of a job. Children inherit it,
// so after a crash of the RTE the processes of a job can be found and told apart from
// unrelated ones that reuse a pid.
const JobIDEnv = "AF_JOB_ID"

// KillLeftovers stops what remains of a job whose RTE died without stopping it: every process
// in process group pgid (the start record's pid, since each job leads its own group) whose
// environment names the job. A process whose environment cannot be read, or names another
// job, is left alone. It returns how many processes it signalled. Linux only: it reads /proc.
//
// ansible-playbook itself dies with the RTE (its parent-death signal); its forks and the
// commands they ran do not, and without this they would run on with nobody reading them.
func KillLeftovers(job string, pgid int) (int, error) {
	if pgid <= 1 {
		return 0, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("look for processes left by job %s: %w", job, err)
	}
	marker := []byte(JobIDEnv + "=" + job + "\x00")
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 1 {
			continue
		}
		if processGroup(pid) != pgid {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, marker...)) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n, nil
}

// processGroup reads the process group id from /proc/<pid>/stat, or -1.
func processGroup(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return -1
	}
	// The command name in parentheses may hold spaces; the fields after it are fixed:
	// state, ppid, pgrp.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return -1
	}
	g, err := strconv.Atoi(f[2])
	if err != nil {
		return -1
	}
	return g
}
