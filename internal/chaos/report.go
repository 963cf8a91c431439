package chaos

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what a run found: the counts of its table and every broken invariant.
type Report struct {
	Seed     uint64
	Duration time.Duration
	Faults   []*fault
	Skipped  []string // kinds left out, and why

	Jobs       int
	ByStatus   map[string]int // jobs by end status ("(no end: running)" for those without)
	Produced   int64          // records the RTEs numbered: each job's highest seq, summed
	Stored     int64          // records in the app's store
	Duplicated int64          // seqs, lines or events stored more than once
	Missing    int64          // seqs, lines or events absent below what was produced
	WithoutEnd int
	// SubmitFailures are submits the API did not take (a node killed mid-call); each is tried
	// again, so they cost no job.
	SubmitFailures int
	Lines          int // numbered output lines found in the store
	Events         int // af_events events found in the store

	Violations []string
}

// Failed reports whether any invariant broke.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// faultViolations adds each fault's own failure (not recovered, a process that died when it
// should not have) to the violations.
func (r *Report) faultViolations() {
	for _, f := range r.Faults {
		if f.Failure != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s: %s", f, f.Failure))
		}
	}
}

// Write prints the one table, then the violations.
func (r *Report) Write(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "seed\t%d\n", r.Seed)
	fmt.Fprintf(tw, "duration\t%s\n", r.Duration.Round(time.Second))
	statuses := make([]string, 0, len(r.ByStatus))
	for s := range r.ByStatus {
		statuses = append(statuses, s)
	}
	sort.Strings(statuses)
	parts := make([]string, 0, len(statuses))
	for _, s := range statuses {
		parts = append(parts, fmt.Sprintf("%s %d", s, r.ByStatus[s]))
	}
	fmt.Fprintf(tw, "jobs\t%d\t%s\n", r.Jobs, strings.Join(parts, ", "))
	fmt.Fprintf(tw, "submits that failed\t%d\t(tried again)\n", r.SubmitFailures)
	fmt.Fprintf(tw, "records produced\t%d\n", r.Produced)
	fmt.Fprintf(tw, "records stored\t%d\n", r.Stored)
	fmt.Fprintf(tw, "numbered lines stored\t%d\n", r.Lines)
	fmt.Fprintf(tw, "events stored\t%d\n", r.Events)
	fmt.Fprintf(tw, "duplicated\t%d\t(must be 0)\n", r.Duplicated)
	fmt.Fprintf(tw, "missing\t%d\t(must be 0)\n", r.Missing)
	fmt.Fprintf(tw, "jobs without an end\t%d\t(must be 0)\n", r.WithoutEnd)
	fmt.Fprintf(tw, "\t\t\n")
	fmt.Fprintf(tw, "fault\tinjected\tmid-job\trecovered\tmedian\tmax\n")
	injected, missed := 0, 0
	for _, k := range Kinds {
		var times []time.Duration
		n, mid, rec := 0, 0, 0
		for _, f := range r.Faults {
			if f.Kind != k || f.Start.IsZero() {
				continue
			}
			n++
			if f.MidJob {
				mid++
			}
			if f.Missed {
				missed++
				continue
			}
			if f.Recovered > 0 {
				rec++
				times = append(times, f.Recovered)
			}
		}
		injected += n
		if n == 0 {
			continue
		}
		median, most := "-", "-"
		if len(times) > 0 {
			slices.Sort(times)
			median = fmt.Sprintf("%.1fs", times[len(times)/2].Seconds())
			most = fmt.Sprintf("%.1fs", times[len(times)-1].Seconds())
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", k, n, mid, rec, median, most)
	}
	fmt.Fprintf(tw, "all\t%d\t\t\t\t\n", injected)
	tw.Flush()
	if missed > 0 {
		fmt.Fprintf(w, "%d bundle-cuts found no transfer to cut within %s (counted as injected, not as recovered)\n", missed, bundleWait)
	}
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "skipped: %s\n", s)
	}
	if !r.Failed() {
		fmt.Fprintf(w, "PASS: every invariant held\n")
		return
	}
	fmt.Fprintf(w, "FAIL: %d invariant failures\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  %s\n", v)
	}
}
