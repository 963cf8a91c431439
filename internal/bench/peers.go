package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rte-project/rte/internal/testenv"
)

// The three ways of running a playbook that the peers section compares.
const (
	ToolPlaybook = "ansible-playbook"
	ToolRunner   = "ansible-runner"
	ToolRTE      = "rte"
)

// Playbooks are the two the issue names, written into a directory by writePlaybooks.
const (
	PlaybookTasks  = "task-heavy"
	PlaybookOutput = "output-heavy"
)

// PeerSizes size the two playbooks: Tasks debug tasks over Hosts local hosts, and one task
// printing OutputLines lines of 100 bytes.
type PeerSizes struct {
	Tasks, Hosts, OutputLines int
}

// peerFiles are the playbooks laid out for each tool: a playbook and an inventory directory for
// ansible-playbook and the RTE (RTE_FILES=local), and one private data directory per playbook
// for ansible-runner.
type peerFiles struct {
	playbooks, inventory string
	private              map[string]string // playbook name -> private data dir
	file, inv            map[string]string // playbook name -> playbook file, inventory file
}

func writePlaybooks(dir string, s PeerSizes) (*peerFiles, error) {
	f := &peerFiles{
		playbooks: filepath.Join(dir, "playbooks"), inventory: filepath.Join(dir, "inventory"),
		private: map[string]string{},
		file:    map[string]string{PlaybookTasks: "tasks.yml", PlaybookOutput: "output.yml"},
		inv:     map[string]string{PlaybookTasks: "hosts.yml", PlaybookOutput: "local.yml"},
	}
	var tasks strings.Builder
	tasks.WriteString("- hosts: all\n  gather_facts: false\n  connection: local\n  tasks:\n")
	for i := 1; i <= s.Tasks; i++ {
		fmt.Fprintf(&tasks, "    - debug:\n        msg: \"task %d on {{ inventory_hostname }}\"\n", i)
	}
	// The default callback prints the list one element a line: 8 spaces, 88 x's in quotes
	// and a comma make 100 bytes with the newline.
	output := fmt.Sprintf("- hosts: all\n  gather_facts: false\n  connection: local\n  tasks:\n"+
		"    - debug:\n        msg: \"{{ [line] * %d }}\"\n      vars:\n        line: \"{{ 'x' * 88 }}\"\n", s.OutputLines)
	// YAML inventories: an INI value holding spaces, as "{{ ansible_playbook_python }}" does,
	// does not parse.
	var hosts strings.Builder
	hosts.WriteString("all:\n  vars:\n    ansible_connection: local\n    ansible_python_interpreter: \"{{ ansible_playbook_python }}\"\n  hosts:\n")
	for i := 1; i <= s.Hosts; i++ {
		fmt.Fprintf(&hosts, "    h%d: {}\n", i)
	}
	local := "all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: \"{{ ansible_playbook_python }}\"\n"
	content := map[string]string{PlaybookTasks: tasks.String(), PlaybookOutput: output}
	invs := map[string]string{PlaybookTasks: hosts.String(), PlaybookOutput: local}
	for _, name := range []string{PlaybookTasks, PlaybookOutput} {
		pd := filepath.Join(dir, "runner-"+name)
		f.private[name] = pd
		for path, body := range map[string]string{
			filepath.Join(f.playbooks, f.file[name]):    content[name],
			filepath.Join(f.inventory, f.inv[name]):     invs[name],
			filepath.Join(pd, "project", f.file[name]):  content[name],
			filepath.Join(pd, "inventory", "hosts.yml"): invs[name],
		} {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				return nil, err
			}
		}
	}
	return f, nil
}

// PeerResult is one run of one playbook by one tool.
type PeerResult struct {
	Playbook string
	Tool     string
	Round    int
	Wall     time.Duration
	Usage    Usage
	// Peaks is the peak RSS per process of the RTE path (rte, rte-app serve, the rte-app run
	// client, ansible-playbook under the RTE); empty for the peers, whose Usage.MaxRSS is exact.
	Peaks map[string]int64 `json:",omitempty"`
	// CPUs is the CPU per process of the RTE path: ansible-playbook (reaped by the RTE), rte,
	// rte-app serve, rte-app run; empty for the peers.
	CPUs   map[string]time.Duration `json:",omitempty"`
	Stdout int64                    // bytes the tool printed (the RTE path: what rte-app run printed)
	tail   string                   // the end of what it printed, for the check of its recap
	// Failed says why the run does not count: it exited 0 but its output lacks the recap of a
	// finished playbook (seen with ansible-runner process, in the third round). It stays in the raw results
	// and the table says how many runs were left out of the figures.
	Failed string `json:",omitempty"`
}

// counter counts what a tool prints and keeps only its last tailBytes, so no tool pays for a
// disk write of its output that another does not. os/exec calls Write from one goroutine.
type counter struct {
	n    int64
	tail []byte
}

const tailBytes = 64 << 10

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	c.tail = append(c.tail, p[max(0, len(p)-tailBytes):]...)
	if len(c.tail) > 2*tailBytes {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-tailBytes:]...)
	}
	return len(p), nil
}

// checkRecap refuses a run whose output does not show the playbook done: every host's recap
// with all its tasks ok, and for the output-heavy one, at least the bytes it prints.
func checkRecap(res PeerResult, s PeerSizes) error {
	hosts, ok, least := s.Hosts, s.Tasks, int64(0)
	if res.Playbook == PlaybookOutput {
		hosts, ok, least = 1, 1, int64(s.OutputLines)*100
	}
	if n := strings.Count(res.tail, fmt.Sprintf("ok=%d ", ok)); n < hosts {
		return fmt.Errorf("%s by %s: the recap shows %d of %d hosts with ok=%d; the end of its output:\n%s", res.Playbook, res.Tool, n, hosts, ok, testenv.Tail(res.tail, 15))
	}
	if res.Stdout < least {
		return fmt.Errorf("%s by %s printed %d bytes, fewer than the %d the playbook prints", res.Playbook, res.Tool, res.Stdout, least)
	}
	return nil
}

// runCounted runs cmd with stdout counted and stderr kept for an error, and returns its wall
// time and wait4 usage.
func runCounted(cmd *exec.Cmd) (time.Duration, Usage, *counter, error) {
	var out counter
	var errBuf strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &limitedWriter{w: &errBuf, left: 8 << 10}
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if err != nil {
		return wall, Usage{}, &out, fmt.Errorf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, errBuf.String())
	}
	return wall, ExitUsage(cmd.ProcessState), &out, nil
}

type limitedWriter struct {
	w    io.Writer
	left int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.left > 0 {
		n := min(len(p), l.left)
		l.left -= n
		_, _ = l.w.Write(p[:n])
	}
	return len(p), nil
}

// runPlaybook runs ansible-playbook itself.
func runPlaybook(ctx context.Context, f *peerFiles, name string) (PeerResult, error) {
	cmd := exec.CommandContext(ctx, "ansible-playbook", "-i", filepath.Join(f.inventory, f.inv[name]), filepath.Join(f.playbooks, f.file[name]))
	cmd.Dir = f.playbooks
	wall, u, n, err := runCounted(cmd)
	return PeerResult{Playbook: name, Tool: ToolPlaybook, Wall: wall, Usage: u, Stdout: n.n, tail: string(n.tail)}, err
}

// runRunner runs ansible-runner's remote-execution pipeline, transmit | worker | process, the
// way AWX's receptor runs a job: the wait4 usage of the shell holds all three and ansible.
func runRunner(ctx context.Context, f *peerFiles, name, work string) (PeerResult, error) {
	wdir, err := os.MkdirTemp(work, "runner-worker-")
	if err != nil {
		return PeerResult{}, err
	}
	odir, err := os.MkdirTemp(work, "runner-process-")
	if err != nil {
		return PeerResult{}, err
	}
	defer os.RemoveAll(wdir)
	defer os.RemoveAll(odir)
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c",
		`ansible-runner transmit "$1" -p "$2" | ansible-runner worker --private-data-dir "$3" | ansible-runner process "$4"`,
		"bash", f.private[name], f.file[name], wdir, odir)
	wall, u, n, err := runCounted(cmd)
	if err == nil {
		// ansible-runner process exits 0 whatever the playbook did; its artifacts say.
		rc, rerr := os.ReadFile(filepath.Join(odir, "artifacts", "rc"))
		if rerr == nil && strings.TrimSpace(string(rc)) != "0" {
			err = fmt.Errorf("ansible-runner: the playbook exited %s", strings.TrimSpace(string(rc)))
		}
	}
	return PeerResult{Playbook: name, Tool: ToolRunner, Wall: wall, Usage: u, Stdout: n.n, tail: string(n.tail)}, err
}

// runRTE submits the playbook to the rig's RTE with `rte-app run`, which follows it to its end
// as `rte-app follow` does. CPU and bytes written are the client's wait4 usage plus the
// difference of the app's and the RTE's /proc counters, which hold ansible-playbook once the
// RTE has reaped it.
func runRTE(ctx context.Context, r *Rig, appBin string, f *peerFiles, name string) (PeerResult, error) {
	res := PeerResult{Playbook: name, Tool: ToolRTE, Peaks: map[string]int64{}, CPUs: map[string]time.Duration{}}
	pids := map[string]int{"rte": r.RTE.Pid(), "rte-app serve": r.App.Pid()}
	before := map[string]Counters{}
	for who, pid := range pids {
		c, err := ReadCounters(pid)
		if err != nil {
			return res, err
		}
		before[who] = c
		if err := ResetPeak(pid); err != nil {
			return res, err
		}
	}
	sampler := sampleDescendants(r.RTE.Pid(), 200*time.Millisecond)
	cmd := exec.CommandContext(ctx, appBin, "run", "--runner", r.Name, "--playbook", f.file[name], "-i", f.inv[name])
	cmd.Env = append(os.Environ(), "APP_URL="+r.App.URL, "APP_ADMIN_TOKEN="+r.App.Token)
	wall, u, n, err := runCounted(cmd)
	res.Peaks["ansible-playbook (sampled)"] = sampler.Stop()
	res.Wall, res.Stdout, res.tail = wall, n.n, string(n.tail)
	if err != nil {
		return res, err
	}
	res.Peaks["rte-app run"] = u.MaxRSS
	res.CPUs["rte-app run"] = u.CPU
	total := u
	for who, pid := range pids {
		c, err := ReadCounters(pid)
		if err != nil {
			return res, err
		}
		d := c.Sub(before[who])
		peak, err := PeakRSS(pid)
		if err != nil {
			return res, err
		}
		res.Peaks[who] = peak
		res.CPUs[who] = d.CPU - d.ChildCPU
		if who == "rte" {
			res.CPUs["ansible-playbook"] = d.ChildCPU
		}
		total = total.Add(Usage{CPU: d.CPU, WriteDisk: d.WriteDisk, MaxRSS: peak})
	}
	total.MaxRSS = max(total.MaxRSS, res.Peaks["ansible-playbook (sampled)"])
	res.Usage = total
	return res, nil
}

// Peers runs both playbooks rounds times with each tool, alternating which tool goes first in
// each round so that load from other work on the machine falls on all three alike.
func Peers(ctx context.Context, bin Binaries, work string, s PeerSizes, rounds int, progress io.Writer) ([]PeerResult, error) {
	f, err := writePlaybooks(filepath.Join(work, "peers"), s)
	if err != nil {
		return nil, err
	}
	path := os.Getenv("PATH")
	r, err := StartRig(ctx, RigConfig{Bin: bin, Dir: filepath.Join(work, "peers-rig"), Path: path,
		AnsiblePath: f.playbooks, RepoPath: f.inventory})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	tools := []string{ToolPlaybook, ToolRunner, ToolRTE}
	var out []PeerResult
	for round := 1; round <= rounds; round++ {
		for _, name := range []string{PlaybookTasks, PlaybookOutput} {
			for i := range tools {
				tool := tools[(i+round-1)%len(tools)]
				var res PeerResult
				var err error
				switch tool {
				case ToolPlaybook:
					res, err = runPlaybook(ctx, f, name)
				case ToolRunner:
					res, err = runRunner(ctx, f, name, work)
				case ToolRTE:
					res, err = runRTE(ctx, r, bin.App, f, name)
				}
				res.Round = round
				if err == nil {
					if cerr := checkRecap(res, s); cerr != nil {
						res.Failed = cerr.Error()
						fmt.Fprintf(progress, "  round %d %-12s %-16s LEFT OUT: %s\n", round, name, tool, strings.SplitN(res.Failed, "\n", 2)[0])
					}
				}
				if err != nil {
					return out, fmt.Errorf("round %d, %s by %s: %w", round, name, tool, err)
				}
				fmt.Fprintf(progress, "  round %d %-12s %-16s wall %6.1fs cpu %6.1fs peak %s printed %s\n", round, name, tool,
					res.Wall.Seconds(), res.Usage.CPU.Seconds(), mb(res.Usage.MaxRSS), mb(res.Stdout))
				out = append(out, res)
			}
		}
	}
	return out, nil
}

func mb(n int64) string { return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB" }
