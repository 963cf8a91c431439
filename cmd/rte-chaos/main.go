// Command rte-chaos runs the chaos harness (package internal/chaos): the reference app as two
// processes, real RTEs, jobs in flight, and faults at moments drawn from -seed; then it checks
// the app's store and prints one table. It exits 1 when an invariant broke, 2 on bad flags,
// 3 when the harness itself could not run. docs/reliability.md explains the table.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rte-project/rte/internal/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rte-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()), "the seed of the fault schedule and the jobs; a failing run replays with it")
	faults := fs.Int("faults", 40, "how many faults to inject")
	rtes := fs.Int("rtes", 4, "RTE processes, each behind its own forwarder")
	jobs := fs.Int("jobs", 6, "jobs kept in flight")
	kinds := fs.String("kinds", "all", "comma-separated fault kinds: rte-kill, rte-term, rte-hup, node-kill, cut, stall, spool-full, bundle-cut")
	gap := fs.Duration("gap", 3*time.Second, "mean pause between two faults")
	out := fs.String("out", "", "work directory, new or empty (default: a temporary one)")
	keep := fs.Bool("keep", false, "keep the work directory: logs, the app's database, the spools")
	rteBin := fs.String("rte", "", "the rte binary (default: build it)")
	appBin := fs.String("rte-app", "", "the rte-app binary (default: build it)")
	race := fs.Bool("race", false, "build the binaries with -race")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rte-chaos: unexpected argument %q; it takes flags only (-h lists them)\n", fs.Arg(0))
		return 2
	}
	ks, err := chaos.ParseKinds(*kinds)
	if err != nil {
		fmt.Fprintf(stderr, "rte-chaos: %v\n", err)
		return 2
	}
	rep, err := chaos.Run(ctx, chaos.Config{
		Seed: *seed, Faults: *faults, RTEs: *rtes, Jobs: *jobs, Kinds: ks, Gap: *gap,
		Out: *out, Keep: *keep, RTEBin: *rteBin, AppBin: *appBin, Race: *race, Log: stdout,
	})
	if err != nil {
		fmt.Fprintf(stderr, "rte-chaos: %v\n", err)
		return 3
	}
	fmt.Fprintln(stdout)
	rep.Write(stdout)
	fmt.Fprintf(stdout, "replay: go run ./cmd/rte-chaos -seed %d -faults %d -rtes %d -jobs %d -kinds %s -gap %s\n",
		*seed, *faults, *rtes, *jobs, *kinds, *gap)
	if rep.Failed() {
		return 1
	}
	return 0
}
