package bench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// Results are one run of every section asked for; a section not run is nil or empty.
type Results struct {
	Command  string
	Started  time.Time
	Duration time.Duration
	Machine  Machine
	Rounds   int
	Sizes    PeerSizes
	Peers    []PeerResult  `json:",omitempty"`
	Record   *RecordResult `json:",omitempty"`
	Events   []FlowResult  `json:",omitempty"`
	Scale    *ScaleResult  `json:",omitempty"`
	Files    *FilesResult  `json:",omitempty"`
}

// Aims the issue states.
const (
	aimTasksRatio  = 1.02 // RTE path within 2% of ansible-playbook on the task-heavy playbook
	aimOutputRatio = 1.05 // and within 5% on the output-heavy one
	aimRecordMBps  = 100
	aimEventsPerS  = 20000
	aimJobBytes    = 2 << 20 // the RTE's memory per running job (docs/benchmarks.md, Memory per running job)
)

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is "median (min–max)" of xs with format f, or the value alone for one.
func spread(xs []float64, f string) string {
	if len(xs) == 1 {
		return fmt.Sprintf(f, xs[0])
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", median(xs), slices.Min(xs), slices.Max(xs))
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

type table struct{ rows [][5]string }

func (t *table) add(section, measure, result, aim, reached string) {
	t.rows = append(t.rows, [5]string{section, measure, result, aim, reached})
}

// Markdown is the run as the block rte-bench writes between the markers of
// docs/benchmarks.md: the command, the machine, and one table.
func (r *Results) Markdown() string {
	var t table
	r.peerRows(&t)
	r.recordRows(&t)
	r.eventRows(&t)
	r.scaleRows(&t)
	r.filesRows(&t)
	var b strings.Builder
	fmt.Fprintf(&b, "Command: `%s`, started %s, took %s.\n\n", r.Command, r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Duration.Round(time.Second))
	b.WriteString(r.Machine.Markdown() + "\n\n")
	b.WriteString("| section | measure | result: median (min–max) over the rounds | aim | reached |\n|---|---|---|---|---|\n")
	for _, row := range t.rows {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row[:], " | "))
	}
	return b.String()
}

func (r *Results) peerRows(t *table) {
	if len(r.Peers) == 0 {
		return
	}
	for _, pb := range []string{PlaybookTasks, PlaybookOutput} {
		label := fmt.Sprintf("%s (%d debug tasks × %d local hosts)", pb, r.Sizes.Tasks, r.Sizes.Hosts)
		aim := aimTasksRatio
		if pb == PlaybookOutput {
			label = fmt.Sprintf("%s (one task printing %d lines, %.0f MB)", pb, r.Sizes.OutputLines, float64(r.Sizes.OutputLines)*100/1e6)
			aim = aimOutputRatio
		}
		byTool := map[string][]PeerResult{}
		leftOut := map[string]int{}
		for _, p := range r.Peers {
			switch {
			case p.Playbook != pb:
			case p.Failed != "":
				leftOut[p.Tool]++
			default:
				byTool[p.Tool] = append(byTool[p.Tool], p)
			}
		}
		for _, tool := range []string{ToolPlaybook, ToolRunner, ToolRTE} {
			runs := byTool[tool]
			if len(runs) == 0 {
				if leftOut[tool] > 0 {
					t.add("peers", label+": "+tool, fmt.Sprintf("every run left out: its output lacked a finished playbook's recap (-out has the runs)"), "", "")
				}
				continue
			}
			var wall, cpu, peak, written []float64
			for _, p := range runs {
				wall = append(wall, p.Wall.Seconds())
				cpu = append(cpu, p.Usage.CPU.Seconds())
				peak = append(peak, float64(p.Usage.MaxRSS)/1e6)
				written = append(written, float64(p.Usage.WriteDisk)/1e6)
			}
			result := fmt.Sprintf("wall %s s, CPU %s s, peak RSS %s MB, written %s MB", spread(wall, "%.1f"), spread(cpu, "%.1f"),
				spread(peak, "%.0f"), spread(written, "%.1f"))
			if tool == ToolRTE {
				var parts []string
				for _, who := range []string{"rte", "rte-app serve", "rte-app run", "ansible-playbook (sampled)"} {
					var xs []float64
					for _, p := range runs {
						xs = append(xs, float64(p.Peaks[who])/1e6)
					}
					parts = append(parts, fmt.Sprintf("%s %.0f", who, median(xs)))
				}
				result += "; peak RSS per process (MB): " + strings.Join(parts, ", ")
				parts = parts[:0]
				for _, who := range []string{"ansible-playbook", "rte", "rte-app serve", "rte-app run"} {
					var xs []float64
					for _, p := range runs {
						xs = append(xs, p.CPUs[who].Seconds())
					}
					parts = append(parts, fmt.Sprintf("%s %.1f", who, median(xs)))
				}
				result += "; CPU per process (s): " + strings.Join(parts, ", ")
			}
			if n := leftOut[tool]; n > 0 {
				result += fmt.Sprintf("; %d run(s) left out: the output lacked a finished playbook's recap though the tool exited 0 (-out has them)", n)
			}
			t.add("peers", label+": "+tool, result, "", "")
		}
		for _, tool := range []string{ToolRTE, ToolRunner} {
			wallRatio, cpuRatio := pairedRatios(byTool[ToolPlaybook], byTool[tool])
			if len(wallRatio) == 0 {
				continue
			}
			result := fmt.Sprintf("wall %s×, CPU %s×", spread(wallRatio, "%.2f"), spread(cpuRatio, "%.2f"))
			if tool == ToolRTE {
				// Both: on a shared machine the wall time moves with the load, the CPU less so.
				t.add("peers", pb+": RTE path / ansible-playbook, paired by round", result,
					fmt.Sprintf("wall and CPU ≤ %.2f×", aim), yesNo(median(wallRatio) <= aim && median(cpuRatio) <= aim))
			} else {
				t.add("peers", pb+": ansible-runner pipeline / ansible-playbook, paired by round", result, "", "")
			}
		}
	}
}

// pairedRatios divides each round's run of b by the same round's run of a.
func pairedRatios(a, b []PeerResult) (wall, cpu []float64) {
	for _, x := range a {
		for _, y := range b {
			if x.Round == y.Round && x.Wall > 0 && x.Usage.CPU > 0 {
				wall = append(wall, y.Wall.Seconds()/x.Wall.Seconds())
				cpu = append(cpu, y.Usage.CPU.Seconds()/x.Usage.CPU.Seconds())
			}
		}
	}
	return wall, cpu
}

func (r *Results) recordRows(t *table) {
	if r.Record == nil || len(r.Record.Flows) == 0 {
		return
	}
	rec := r.Record
	var rate, rteCPU, appCPU, rteW, appW []float64
	for _, f := range rec.Flows {
		gb := float64(f.Produced) / 1e9
		rate = append(rate, float64(f.Produced)/1e6/f.Wall.Seconds())
		rteCPU = append(rteCPU, f.RTECPU.Seconds()/gb)
		appCPU = append(appCPU, f.AppCPU.Seconds()/gb)
		rteW = append(rteW, float64(f.RTEWrite)/1e9/gb)
		appW = append(appW, float64(f.AppWrite)/1e9/gb)
	}
	first := rec.Flows[0]
	t.add("record path", fmt.Sprintf("stand-in printing %.0f MB as fast as it can → one RTE (batch, mask, spool with fsync, TLS) → app (SQLite, synchronous=FULL), until the app holds the end; store checked byte for byte", float64(first.Produced)/1e6),
		spread(rate, "%.1f")+" MB/s", fmt.Sprintf("%d MB/s", aimRecordMBps), yesNo(median(rate) >= aimRecordMBps))
	t.add("record path", "CPU per GB of output: the RTE's own / the app's (the stand-in's own apart)", spread(rteCPU, "%.1f")+" s / "+spread(appCPU, "%.1f")+" s", "", "")
	t.add("record path", "written to disk per GB of output: RTE's spool / app's SQLite", spread(rteW, "%.2f")+" GB / "+spread(appW, "%.2f")+" GB", "", "")
	diskBest := 0.0
	for _, block := range []int{64 << 10, 1 << 20} {
		var xs []float64
		for _, d := range rec.Disk {
			if d.Block == block {
				xs = append(xs, d.MBps())
			}
		}
		if len(xs) == 0 {
			continue
		}
		diskBest = max(diskBest, median(xs))
		t.add("record path", fmt.Sprintf("the disk's limit: sequential writes of %d KiB + fsync each, same directory, between the rounds", block>>10),
			spread(xs, "%.1f")+" MB/s", "", "")
	}
	if sp := rec.Spool; sp.Wall > 0 {
		spRate := float64(sp.Bytes) / 1e6 / sp.Wall.Seconds()
		t.add("record path", "the RTE's spool alone: 64 KiB output records, appended as the job runner does (32 waiting for fsync at most)",
			fmt.Sprintf("%.1f MB/s, %.1f records per fsync", spRate, float64(sp.Records)/float64(max(sp.Fsyncs, 1))),
			fmt.Sprintf("≥ half the disk's best (%.1f MB/s)", diskBest/2), yesNo(spRate >= diskBest/2))
		var perCore []float64
		for _, f := range rec.Flows {
			perCore = append(perCore, float64(f.Produced)/1e6/f.RTECPU.Seconds())
		}
		t.add("record path", "the RTE's side (batch, mask, spool with fsync, send) as its CPU allows: output MB per second of the RTE's own CPU, one core's worth",
			spread(perCore, "%.1f")+" MB/s", fmt.Sprintf("≥ half the disk's best (%.1f MB/s)", diskBest/2), yesNo(median(perCore) >= diskBest/2))
	}
}

func (r *Results) eventRows(t *table) {
	if len(r.Events) == 0 {
		return
	}
	var rate, rteCPU, appCPU []float64
	for _, f := range r.Events {
		rate = append(rate, float64(f.Produced)/f.Wall.Seconds())
		rteCPU = append(rteCPU, f.RTECPU.Seconds())
		appCPU = append(appCPU, f.AppCPU.Seconds())
	}
	t.add("events", fmt.Sprintf("stand-in writing %d ansible-runner-shaped events (about 700 B each) to AF_EVENTS_FD as fast as it can → one RTE → app store; count checked", r.Events[0].Produced),
		spread(rate, "%.0f")+" events/s", fmt.Sprintf("%d/s", aimEventsPerS), yesNo(median(rate) >= aimEventsPerS))
	t.add("events", "CPU of the run: RTE / app", spread(rteCPU, "%.1f")+" s / "+spread(appCPU, "%.1f")+" s", "", "")
}

func (r *Results) scaleRows(t *table) {
	s := r.Scale
	if s == nil {
		return
	}
	if s.RTEJobsRSS > 0 {
		per := float64(s.RTEJobsRSS) / float64(s.Jobs)
		above := float64(s.RTEJobsRSS-s.RTEIdleRSS) / float64(s.Jobs)
		t.add("scale", fmt.Sprintf("one RTE running %d jobs at once (stand-ins sleeping; their own processes not counted)", s.Jobs),
			fmt.Sprintf("RSS %.1f MB (idle %.1f MB): %.0f KB per job above idle, %.0f KB per job as RSS / %d", float64(s.RTEJobsRSS)/1e6,
				float64(s.RTEIdleRSS)/1e6, above/1e3, per/1e3, s.Jobs),
			"≤ 2 MiB per job", yesNo(per <= aimJobBytes))
	}
	if s.AppSockRSS > 0 {
		t.add("scale", fmt.Sprintf("one app node holding %d idle sockets to fake RTEs (app/apptest, real protocol over TLS, in another process)", s.Sockets),
			fmt.Sprintf("%d connected; RSS %.1f MB (no runners: %.1f MB): %.1f KB per socket", s.Connected, float64(s.AppSockRSS)/1e6,
				float64(s.AppIdleRSS)/1e6, float64(s.AppSockRSS-s.AppIdleRSS)/float64(s.Sockets)/1e3), "", "")
	}
}

// Markers delimit the block of docs/benchmarks.md that rte-bench -write replaces.
const (
	MarkBegin = "<!-- rte-bench:begin -->"
	MarkEnd   = "<!-- rte-bench:end -->"
)

// WriteBetweenMarkers replaces what lies between the markers in the file at path with block.
func WriteBetweenMarkers(path, block string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(b, []byte(MarkBegin)), bytes.Index(b, []byte(MarkEnd))
	if i < 0 || j < i {
		return errors.New(path + " has no " + MarkBegin + " ... " + MarkEnd + " block: add the two markers where the table belongs")
	}
	var out bytes.Buffer
	out.Write(b[:i+len(MarkBegin)])
	out.WriteString("\n" + block)
	out.Write(b[j:])
	return os.WriteFile(path, out.Bytes(), 0o644)
}

func (r *Results) filesRows(t *table) {
	f := r.Files
	if f == nil {
		return
	}
	fetched := f.Index + f.Frames
	t.add("files", fmt.Sprintf("one changed file in %d (%.1f MB of playbooks, one line appended to one file): what the RTE fetches with bundle.frames (the index message and the frames its cache lacks) against the whole bundle sent again without it", f.Files, float64(f.TreeBytes)/1e6),
		fmt.Sprintf("%.1f KB (index %.1f KB + %d of %d frames %.1f KB) against %.0f KB whole: %.1f%%; the changed file alone compressed: %.1f KB",
			float64(fetched)/1e3, float64(f.Index)/1e3, f.NewFrames, f.AllFrames, float64(f.Frames)/1e3, float64(f.Whole)/1e3,
			100*float64(fetched)/float64(f.Whole), float64(f.FileAlone)/1e3),
		"about the one file's compressed size (≤ 2×)", yesNo(fetched <= 2*f.FileAlone))
}
