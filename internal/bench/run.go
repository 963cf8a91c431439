package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Sections, in the order they run.
var Sections = []string{"peers", "record", "events", "scale", "files"}

// Options are one run's sections and sizes. The zero sizes are not defaults: the command sets
// them from its flags, and the test from its tiny ones.
type Options struct {
	Command  string   // the command line, for the record
	Only     []string // sections to run; all when empty
	Rounds   int
	Root     string // the module, to build rte and rte-app from
	Work     string // the work directory: stores, spools and the disk's rate are measured here
	Bin      Binaries
	Self     string // this program, started again to serve the fake RTEs
	Peers    PeerSizes
	Record   int64 // bytes the record path's stand-in prints per round
	Disk     int64 // bytes of the 1 MiB-block disk measurement (a quarter with 64 KiB blocks)
	Events   int   // events per round
	Jobs     int   // jobs at once on one RTE
	Sockets  int   // sockets on one app node
	Files    int   // files in the directory of which one changes
	Progress io.Writer
}

// CheckOnly refuses section names that do not exist.
func CheckOnly(only []string) error {
	for _, s := range only {
		if !slices.Contains(Sections, s) {
			return fmt.Errorf("-only: no section %q; the sections are %s", s, strings.Join(Sections, ", "))
		}
	}
	return nil
}

func (o *Options) runs(section string) bool {
	return len(o.Only) == 0 || slices.Contains(o.Only, section)
}

// Run builds the binaries when not given, runs the sections asked for and returns what they
// measured. A section that fails stops the run: a table with a hole would read as a result.
func Run(ctx context.Context, o Options) (*Results, error) {
	if err := CheckOnly(o.Only); err != nil {
		return nil, err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if err := os.MkdirAll(o.Work, 0o700); err != nil {
		return nil, err
	}
	res := &Results{Command: o.Command, Started: time.Now(), Rounds: o.Rounds, Sizes: o.Peers, Machine: DescribeMachine(o.Work)}
	var err error
	fmt.Fprintf(o.Progress, "building rte and rte-app (unless given)\n")
	if o.Bin, err = BuildBinaries(o.Root, filepath.Join(o.Work, "bin"), o.Bin); err != nil {
		return nil, err
	}
	if o.runs("peers") {
		fmt.Fprintf(o.Progress, "peers: ansible-playbook, ansible-runner transmit|worker|process and the RTE path, alternating, %d rounds\n", o.Rounds)
		if res.Peers, err = Peers(ctx, o.Bin, o.Work, o.Peers, o.Rounds, o.Progress); err != nil {
			return nil, fmt.Errorf("peers: %w", err)
		}
	}
	if o.runs("record") {
		fmt.Fprintf(o.Progress, "record path: a stand-in printing %s per job, %d rounds, with the disk's rate between them\n", mb(o.Record), o.Rounds)
		rec, err := RecordPath(ctx, o.Bin, o.Work, o.Record, o.Disk, o.Rounds, o.Progress)
		if err != nil {
			return nil, fmt.Errorf("record path: %w", err)
		}
		res.Record = &rec
	}
	if o.runs("events") {
		fmt.Fprintf(o.Progress, "events: a stand-in writing %d events per job, %d rounds\n", o.Events, o.Rounds)
		if res.Events, err = Events(ctx, o.Bin, o.Work, o.Events, o.Rounds, o.Progress); err != nil {
			return nil, fmt.Errorf("events: %w", err)
		}
	}
	if o.runs("scale") {
		fmt.Fprintf(o.Progress, "scale: %d jobs on one RTE, %d sockets on one app node\n", o.Jobs, o.Sockets)
		sc, err := Scale(ctx, o.Bin, o.Work, o.Self, o.Jobs, o.Sockets, o.Progress)
		if err != nil {
			return nil, fmt.Errorf("scale: %w", err)
		}
		res.Scale = &sc
	}
	if o.runs("files") {
		fmt.Fprintf(o.Progress, "files: one changed file in %d, bytes the RTE fetches\n", o.Files)
		f, err := Files(ctx, o.Work, o.Files)
		if err != nil {
			return nil, fmt.Errorf("files: %w", err)
		}
		res.Files = &f
	}
	res.Machine.LoadAfter = loadAvg()
	res.Duration = time.Since(res.Started)
	return res, nil
}
