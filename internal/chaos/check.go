package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	_ "modernc.org/sqlite" // the driver app/sqlitestore registers; named here for the raw read

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/protocol"
)

// lineRE finds a numbered line as the playbook's debug task prints it: "line-17". A line cut
// in the middle by a kill lacks its closing quote and is not counted.
var lineRE = regexp.MustCompile(`"line-(\d+)"`)

// storedRecord is one row of the records table.
type storedRecord struct {
	seq  int64
	kind string
	data []byte
}

// check reads the app's committed store after the run and adds to rep every count and every
// broken invariant. Jobs and their states come through sqlitestore, as the app reads them;
// records come from the table itself, because Store.Records stops at the first gap and a gap
// is exactly what must be seen.
func check(ctx context.Context, dbPath string, faults []*fault, rtes []*rteBox, rep *Report) error {
	store, err := sqlitestore.Open(dbPath)
	if err != nil {
		return fmt.Errorf("open the app's store %s: %w", dbPath, err)
	}
	defer store.Close()
	jobs, err := store.ListJobs(ctx, app.JobFilter{})
	if err != nil {
		return err
	}
	raw, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		return err
	}
	defer raw.Close()
	names := map[int]string{}
	for i, r := range rtes {
		names[i] = r.name
	}
	for i := len(jobs) - 1; i >= 0; i-- { // oldest first, as they were submitted
		j := jobs[i]
		recs, err := readRecords(ctx, raw, j.ID)
		if err != nil {
			return err
		}
		checkJob(j, recs, faultsOn(faults, names, j.Runner), rep)
	}
	return nil
}

func readRecords(ctx context.Context, db *sql.DB, job string) ([]storedRecord, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, kind, data FROM records WHERE job = ? ORDER BY seq`, job)
	if err != nil {
		return nil, fmt.Errorf("read the records of job %s: %w", job, err)
	}
	defer rows.Close()
	var out []storedRecord
	for rows.Next() {
		var r storedRecord
		if err := rows.Scan(&r.seq, &r.kind, &r.data); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// faultsOn is the faults injected on the runner's RTE.
func faultsOn(faults []*fault, names map[int]string, runner string) []*fault {
	var out []*fault
	for _, f := range faults {
		if !f.Start.IsZero() && names[f.RTE] == runner {
			out = append(out, f)
		}
	}
	return out
}

// checkJob checks one job against every invariant and adds its counts to rep.
func checkJob(j *app.Job, recs []storedRecord, faults []*fault, rep *Report) {
	bad := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf("job %s (runner %s, %s %s): ", j.ID, j.Runner, j.State, j.Status)+fmt.Sprintf(format, args...))
	}
	rep.Jobs++
	status := j.Status
	if j.State != app.JobEnded {
		status = "(no end: " + string(j.State) + ")"
		rep.WithoutEnd++
		bad("has no end after the last fault and the settle time")
	}
	rep.ByStatus[status]++

	// Seqs: 1, 2, 3, ... with none missing and none twice.
	var produced int64
	endAt := int64(0)
	for i, r := range recs {
		produced = max(produced, r.seq)
		if i > 0 && r.seq == recs[i-1].seq {
			rep.Duplicated++
			bad("seq %d stored twice", r.seq)
		}
		if r.kind == protocol.KindEnd {
			if endAt != 0 {
				rep.Duplicated++
				bad("a second end record at seq %d (the first at %d)", r.seq, endAt)
			}
			endAt = r.seq
		}
	}
	rep.Produced += produced
	rep.Stored += int64(len(recs))
	have := map[int64]bool{}
	for _, r := range recs {
		have[r.seq] = true
	}
	var gaps []string
	for s := int64(1); s <= produced; s++ {
		if !have[s] {
			rep.Missing++
			gaps = append(gaps, strconv.FormatInt(s, 10))
		}
	}
	if len(gaps) > 0 {
		bad("records missing at seq %s of %d", strings.Join(gaps, ","), produced)
	}
	if endAt != 0 && endAt != produced {
		bad("records stored after its end record (end at seq %d, last seq %d)", endAt, produced)
	}
	checkLines(j, recs, rep, bad)
	checkEvents(recs, rep, bad)
	if j.State == app.JobEnded {
		if why := unexplained(j, endAt != 0, len(recs), faults); why != "" {
			bad("%s", why)
		}
	}
}

// checkLines checks the numbered lines: 1..N once each for a job that succeeded, a gap-free
// prefix 1..k for one that was cut short.
func checkLines(j *app.Job, recs []storedRecord, rep *Report, bad func(string, ...any)) {
	var spec jobSpec
	if err := json.Unmarshal(j.Start.Extravars, &spec); err != nil || spec.Lines < 1 {
		bad("its extravars %s do not say how many lines it prints", j.Start.Extravars)
		return
	}
	var text strings.Builder
	for _, r := range recs {
		if r.kind != protocol.KindOutput {
			continue
		}
		var d protocol.OutputData
		if err := json.Unmarshal(r.data, &d); err != nil {
			bad("output record %d is not output: %v", r.seq, err)
			continue
		}
		text.WriteString(d.Text)
	}
	seen := map[int]bool{}
	next := 1
	for _, m := range lineRE.FindAllStringSubmatch(text.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		rep.Lines++
		switch {
		case seen[n]:
			rep.Duplicated++
			bad("line-%d stored twice", n)
		case n != next:
			rep.Missing += int64(n - next)
			bad("line-%d follows line-%d: lines %d to %d are missing", n, next-1, next, n-1)
		}
		seen[n] = true
		next = max(next, n+1)
	}
	if j.Status == protocol.StatusSuccess && next-1 != spec.Lines {
		rep.Missing += int64(spec.Lines - (next - 1))
		bad("succeeded with lines 1 to %d stored, want 1 to %d", next-1, spec.Lines)
	}
}

// checkEvents checks the af_events counters: 1, 2, 3, ... once each, in order.
func checkEvents(recs []storedRecord, rep *Report, bad func(string, ...any)) {
	next := int64(1)
	for _, r := range recs {
		if r.kind != protocol.KindEvents {
			continue
		}
		var d protocol.EventsData
		if err := json.Unmarshal(r.data, &d); err != nil {
			bad("events record %d is not events: %v", r.seq, err)
			continue
		}
		for _, e := range d.Events {
			var ev struct {
				Counter int64 `json:"counter"`
			}
			if err := json.Unmarshal(e, &ev); err != nil || ev.Counter < 1 {
				bad("an event of record %d has no counter: %s", r.seq, e)
				continue
			}
			rep.Events++
			switch {
			case ev.Counter < next:
				rep.Duplicated++
				bad("event %d stored again in record %d", ev.Counter, r.seq)
			case ev.Counter > next:
				rep.Missing += ev.Counter - next
				bad("event %d follows event %d in record %d", ev.Counter, next-1, r.seq)
			}
			next = max(next, ev.Counter+1)
		}
	}
}

// unexplained says why the job's end is not one the faults on its runner explain, or "".
// success needs no fault; abandoned needs a kill or a drain of the RTE while the job lived;
// error needs a full spool while it lived, and the end naming the spool. The end must be the
// runner's own record, with one exception: a job the runner accepted and lost to a SIGKILL
// before it spooled anything (it was fetching its files) is ended abandoned by the app, and
// then no record of it may be stored at all. Nothing else (failed, timeout, canceled, another
// end the app made) is explained by a fault.
func unexplained(j *app.Job, runnerEnd bool, stored int, faults []*fault) string {
	// A fault explains an end when the time it lasted (injection to lift) overlaps the job's
	// life: a job submitted while the spool was full fails its first append as surely as one
	// running when it filled.
	during := func(kinds ...Kind) bool {
		for _, f := range faults {
			lifted := f.End
			if lifted.IsZero() {
				lifted = f.Start
			}
			if !f.Start.After(j.EndedAt) && !lifted.Before(j.CreatedAt) {
				for _, k := range kinds {
					if f.Kind == k {
						return true
					}
				}
			}
		}
		return false
	}
	if !runnerEnd {
		if j.Status == protocol.StatusAbandoned && stored == 0 && during(RTEKill) &&
			strings.Contains(j.Message, "before starting it") {
			return ""
		}
		return "ended by the app without the runner's end record: " + j.Message
	}
	switch j.Status {
	case protocol.StatusSuccess:
		return ""
	case protocol.StatusAbandoned:
		if !during(RTEKill, RTETerm) {
			return "abandoned, but its RTE was neither killed nor drained while it ran: " + j.Message
		}
		return ""
	case protocol.StatusError:
		if !during(SpoolFull) || !strings.Contains(j.Message, "spool") {
			return "ended error, which only a full spool while it ran explains: " + j.Message
		}
		return ""
	}
	return fmt.Sprintf("ended %s, which no fault explains: %s", j.Status, j.Message)
}
