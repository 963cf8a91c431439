package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
)

// Machine is what a reader needs to repeat a run: the hardware, the file system the stores
// and the spool lived on, and the versions of everything measured.
type Machine struct {
	CPUs          int
	CPUModel      string
	MemoryGiB     float64
	Kernel        string
	DiskFS        string // file system type of the work directory
	Go            string
	AnsibleCore   string
	AnsibleRunner string
	LoadBefore    string // /proc/loadavg when the run started
	LoadAfter     string
}

// DescribeMachine reads the machine; dir is the work directory whose file system is named.
func DescribeMachine(dir string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadBefore: loadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) == nil {
		m.MemoryGiB = float64(si.Totalram) * float64(si.Unit) / (1 << 30)
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m.Kernel = cString(u.Release[:])
	}
	m.DiskFS = fsType(dir)
	m.AnsibleCore = firstLine("ansible-playbook", "--version")
	m.AnsibleRunner = firstLine("ansible-runner", "--version")
	return m
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// fsType names dir's file system as findmnt does; the statfs magic number when it is missing.
func fsType(dir string) string {
	if out, err := exec.Command("findmnt", "-no", "FSTYPE,SOURCE", "-T", dir).Output(); err == nil {
		return strings.Join(strings.Fields(string(out)), " on ")
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return "?"
	}
	return fmt.Sprintf("statfs type 0x%x", st.Type)
}

// firstLine is the first line a command prints, or "not installed".
func firstLine(name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		return "not installed (" + err.Error() + ")"
	}
	line, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n"))
	return string(line)
}

// Markdown is the machine as a paragraph of docs/benchmarks.md.
func (m Machine) Markdown() string {
	return fmt.Sprintf("Machine: %d CPUs (%s), %.1f GiB memory, kernel %s, work directory on %s; %s, %s, ansible-runner %s. "+
		"Load average (1, 5, 15 min) %s at the start, %s at the end.",
		m.CPUs, m.CPUModel, m.MemoryGiB, m.Kernel, m.DiskFS, m.Go, m.AnsibleCore, m.AnsibleRunner, m.LoadBefore, m.LoadAfter)
}
