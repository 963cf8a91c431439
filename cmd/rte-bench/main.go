// Command rte-bench is the one benchmark command: it builds rte and rte-app, measures the RTE
// path beside ansible-playbook and ansible-runner and beside the machine's own limits, prints
// one table, and with -write puts it into docs/benchmarks.md. Package internal/bench does the
// work; this file reads the flags.
//
//	go run ./cmd/rte-bench                    # everything, 3 rounds (task benchmark)
//	go run ./cmd/rte-bench -only record,events -rounds 1
//	go run ./cmd/rte-bench -write -out bench.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/rte-project/rte/internal/bench"
	"github.com/rte-project/rte/internal/testenv"
)

func main() {
	bench.ServeFakesFromEnv()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:]))
}

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("rte-bench", flag.ContinueOnError)
	var (
		o                          bench.Options
		only, out, work, doc       string
		write, keep                bool
		outputMB, recordMB, diskMB int
	)
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of each section; the peers alternate their order in each round")
	fs.StringVar(&only, "only", "", "comma-separated sections to run: "+strings.Join(bench.Sections, ", ")+" (default all)")
	fs.BoolVar(&write, "write", false, "replace the block between the rte-bench markers in -doc with the table")
	fs.StringVar(&doc, "doc", "docs/benchmarks.md", "the file -write updates")
	fs.StringVar(&out, "out", "", "write the raw results (every round) as JSON to this file")
	fs.StringVar(&o.Bin.RTE, "rte", "", "the rte binary (default: go build ./cmd/rte into the work directory)")
	fs.StringVar(&o.Bin.App, "rte-app", "", "the rte-app binary (default: go build ./cmd/rte-app)")
	fs.StringVar(&work, "work", "", "the work directory, on the disk to measure (default: a new one under TMPDIR, removed at the end)")
	fs.BoolVar(&keep, "keep", false, "keep the work directory (logs, databases, spools)")
	fs.IntVar(&o.Peers.Tasks, "tasks", 100, "peers: debug tasks in the task-heavy playbook")
	fs.IntVar(&o.Peers.Hosts, "hosts", 5, "peers: local hosts the task-heavy playbook runs on")
	fs.IntVar(&outputMB, "output-mb", 100, "peers: MB the output-heavy playbook's one task prints (100-byte lines)")
	fs.IntVar(&recordMB, "record-mb", 256, "record path: MB the stand-in prints per round")
	fs.IntVar(&diskMB, "disk-mb", 256, "record path: MB written in 1 MiB blocks + fsync to measure the disk (a quarter of it in 64 KiB blocks)")
	fs.IntVar(&o.Events, "events", 200000, "events: events the stand-in writes per round")
	fs.IntVar(&o.Jobs, "jobs", 200, "scale: jobs at once on one RTE (its RTE_MAX_JOBS)")
	fs.IntVar(&o.Sockets, "sockets", 2000, "scale: idle sockets on one app node")
	fs.IntVar(&o.Files, "files", 2000, "files: files in the directory of which one changes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rte-bench takes no arguments, only flags; got %q\n", fs.Args())
		return 2
	}
	if only != "" {
		o.Only = strings.Split(only, ",")
	}
	if err := bench.CheckOnly(o.Only); err != nil {
		fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
		return 2
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"rounds", o.Rounds}, {"tasks", o.Peers.Tasks}, {"hosts", o.Peers.Hosts}, {"output-mb", outputMB}, {"record-mb", recordMB},
		{"disk-mb", diskMB}, {"events", o.Events}, {"jobs", o.Jobs}, {"sockets", o.Sockets}, {"files", o.Files}} {
		if f.v < 1 {
			fmt.Fprintf(os.Stderr, "rte-bench: -%s %d: give 1 or more\n", f.name, f.v)
			return 2
		}
	}
	o.Peers.OutputLines = outputMB * 10000 // 100-byte lines
	o.Record, o.Disk = int64(recordMB)*1e6, int64(diskMB)<<20
	o.Command = strings.Join(append([]string{"go run ./cmd/rte-bench"}, args...), " ")
	var err error
	if o.Root, err = testenv.ModuleRoot(); err != nil {
		fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
		return 2
	}
	if o.Self, err = os.Executable(); err != nil {
		fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
		return 1
	}
	if work == "" {
		if work, err = os.MkdirTemp("", "rte-bench-"); err != nil {
			fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
			return 1
		}
	}
	if o.Work, err = filepath.Abs(work); err != nil {
		fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
		return 1
	}
	if !keep {
		defer os.RemoveAll(o.Work)
	}
	o.Progress = os.Stderr
	res, err := bench.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rte-bench: %v\n(work directory %s%s)\n", err, o.Work, map[bool]string{true: ", kept", false: ", removed; -keep keeps it"}[keep])
		return 1
	}
	table := res.Markdown()
	fmt.Print(table)
	if out != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "rte-bench: %v\n", err)
			return 1
		}
	}
	if write {
		if err := bench.WriteBetweenMarkers(filepath.Join(o.Root, doc), table); err != nil {
			fmt.Fprintf(os.Stderr, "rte-bench: -write: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "wrote the table into %s\n", doc)
	}
	return 0
}
