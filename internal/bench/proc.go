package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux ABI Go runs
// on, and fixed by the kernel's user-space contract, so it is not read with sysconf (cgo).
const clockTicks = 100

// Usage is what one run of a tool cost: CPU (user+sys of the whole process tree), the peak
// resident memory of its largest process, and the bytes it caused to be written to storage.
type Usage struct {
	CPU       time.Duration
	MaxRSS    int64 // bytes
	WriteDisk int64 // bytes sent to the storage layer (write_bytes, or oublock*512)
}

// Add sums CPU and bytes written and keeps the larger peak.
func (u Usage) Add(o Usage) Usage {
	return Usage{CPU: u.CPU + o.CPU, MaxRSS: max(u.MaxRSS, o.MaxRSS), WriteDisk: u.WriteDisk + o.WriteDisk}
}

// ExitUsage is a waited-for child's usage from wait4's rusage: the child and every descendant
// it waited for (ansible's forks, a shell pipeline's members). ru_maxrss is the largest single
// process among them, in KiB on Linux.
func ExitUsage(ps *os.ProcessState) Usage {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return Usage{}
	}
	return Usage{
		CPU:       time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		MaxRSS:    ru.Maxrss * 1024,
		WriteDisk: ru.Oublock * 512,
	}
}

// Counters are a live process's cumulative CPU (its own and its reaped children's, from
// /proc/PID/stat) and bytes written (its own and its reaped children's, /proc/PID/io), read
// before and after a run of a long-running process such as the RTE or the app.
type Counters struct {
	CPU       time.Duration // its own and its reaped children's
	ChildCPU  time.Duration // its reaped children's alone (the RTE's: ansible-playbook's)
	WriteDisk int64
}

// Sub is c - o, the cost of what happened between two readings.
func (c Counters) Sub(o Counters) Counters {
	return Counters{CPU: c.CPU - o.CPU, ChildCPU: c.ChildCPU - o.ChildCPU, WriteDisk: c.WriteDisk - o.WriteDisk}
}

// ReadCounters reads pid's Counters.
func ReadCounters(pid int) (Counters, error) {
	f, err := statFields(strconv.Itoa(pid))
	if err != nil {
		return Counters{}, err
	}
	if len(f) < 15 {
		return Counters{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// utime, stime, cutime, cstime are fields 14 to 17; f[0] is field 3.
	var ticks [4]int64
	for i, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Counters{}, fmt.Errorf("/proc/%d/stat: %v", pid, err)
		}
		ticks[i] = n
	}
	tick := time.Second / clockTicks
	c := Counters{
		CPU:      time.Duration(ticks[0]+ticks[1]+ticks[2]+ticks[3]) * tick,
		ChildCPU: time.Duration(ticks[2]+ticks[3]) * tick,
	}
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return Counters{}, err
	}
	for _, line := range strings.Split(string(io), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			c.WriteDisk, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return c, nil
}

// statFields are the fields of /proc/PID/stat from field 3 (state) on: the command name
// (field 2) may hold spaces and parentheses, so they start after its last ')'.
func statFields(pid string) ([]string, error) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil, err
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	return strings.Fields(string(stat[i+1:])), nil
}

// statusKiB reads one "Name:   N kB" line of /proc/PID/status, in bytes.
func statusKiB(pid int, name string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, name)
}

// RSS is pid's resident memory now.
func RSS(pid int) (int64, error) { return statusKiB(pid, "VmRSS") }

// PeakRSS is pid's peak resident memory since it started or since ResetPeak.
func PeakRSS(pid int) (int64, error) { return statusKiB(pid, "VmHWM") }

// ResetPeak restarts pid's peak resident memory from its current RSS (clear_refs 5), so a
// long-running process's peak can be read per run.
func ResetPeak(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// descendantPeaks samples the peak RSS of every descendant of a process (ansible-playbook and
// its forks under the RTE) every interval, since a process's peak is gone from /proc once it
// is reaped and the parent's rusage is not ours to read. It misses a peak reached within the
// last interval before a process exits.
type descendantPeaks struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  int64
}

func sampleDescendants(root int, every time.Duration) *descendantPeaks {
	d := &descendantPeaks{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			for _, pid := range descendants(root) {
				if hwm, err := PeakRSS(pid); err == nil {
					d.mu.Lock()
					d.max = max(d.max, hwm)
					d.mu.Unlock()
				}
			}
			select {
			case <-d.stop:
				return
			case <-t.C:
			}
		}
	}()
	return d
}

// Stop ends the sampling and returns the largest peak seen.
func (d *descendantPeaks) Stop() int64 {
	close(d.stop)
	<-d.done
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.max
}

// descendants lists the pids below root, from every process's parent in /proc.
func descendants(root int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(e.Name())
		if err != nil || len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		parent[pid] = ppid
	}
	var out []int
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}
