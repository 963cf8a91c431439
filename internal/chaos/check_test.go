package chaos

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// story builds a job's stored records: start, output holding the given line numbers, one
// events record with the given counters, and an end with status (none when status is "").
func story(lines []int, counters []int, status string) []storedRecord {
	var out []storedRecord
	add := func(kind string, data any) {
		b, _ := json.Marshal(data)
		out = append(out, storedRecord{seq: int64(len(out) + 1), kind: kind, data: b})
	}
	add(protocol.KindStart, protocol.StartData{PID: 1, Playbook: "lines.yml"})
	var text strings.Builder
	for _, n := range lines {
		fmt.Fprintf(&text, "        \"line-%d\",\n", n)
	}
	add(protocol.KindOutput, protocol.OutputData{Text: text.String()})
	var evs []json.RawMessage
	for _, c := range counters {
		evs = append(evs, json.RawMessage(fmt.Sprintf(`{"counter":%d,"event":"runner_on_ok"}`, c)))
	}
	add(protocol.KindEvents, protocol.EventsData{Events: evs})
	if status != "" {
		add(protocol.KindEnd, protocol.EndData{Status: status})
	}
	return out
}

func endedJob(status, message string, lines int) *app.Job {
	t0 := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	return &app.Job{ID: "j1", Runner: "rte-1", State: app.JobEnded, Status: status, Message: message,
		CreatedAt: t0, EndedAt: t0.Add(time.Minute),
		Start: protocol.JobStart{Extravars: json.RawMessage(fmt.Sprintf(`{"lines":%d,"batches":1,"pause":1}`, lines))}}
}

// TestCheckJobFindsEachBrokenInvariant feeds checkJob stories that break one invariant each,
// and one that breaks none: every check can fail, and a clean story passes.
func TestCheckJobFindsEachBrokenInvariant(t *testing.T) {
	during := []*fault{{Kind: RTEKill, Start: time.Date(2026, 12, 3, 9, 0, 30, 0, time.UTC)}}
	during[0].End = during[0].Start.Add(time.Second)
	for _, tc := range []struct {
		name      string
		job       *app.Job
		recs      []storedRecord
		faults    []*fault
		violation string
		dup, miss int64
	}{
		{"clean success", endedJob("success", "", 3), story([]int{1, 2, 3}, []int{1, 2}, "success"), nil, "", 0, 0},
		{"clean abandoned prefix", endedJob("abandoned", "", 3), story([]int{1, 2}, []int{1}, "abandoned"), during, "", 0, 0},
		{"line twice", endedJob("success", "", 3), story([]int{1, 2, 2, 3}, []int{1}, "success"), nil, "line-2 stored twice", 1, 0},
		{"line missing", endedJob("success", "", 3), story([]int{1, 3}, []int{1}, "success"), nil, "lines 2 to 2 are missing", 0, 1},
		{"success short", endedJob("success", "", 3), story([]int{1, 2}, []int{1}, "success"), nil, "want 1 to 3", 0, 1},
		{"event twice", endedJob("success", "", 1), story([]int{1}, []int{1, 2, 2}, "success"), nil, "event 2 stored again", 1, 0},
		{"event missing", endedJob("success", "", 1), story([]int{1}, []int{1, 3}, "success"), nil, "event 3 follows event 1", 0, 1},
		{"seq gap", endedJob("success", "", 1), append(story([]int{1}, []int{1}, "")[:1], story([]int{1}, []int{1}, "success")[2:]...), nil, "records missing at seq 2", 0, 2}, // the seq and the line it held
		{"no end", &app.Job{ID: "j1", Runner: "rte-1", State: app.JobRunning, Start: endedJob("", "", 1).Start}, story([]int{1}, []int{1}, ""), nil, "has no end", 0, 0},
		{"abandoned unexplained", endedJob("abandoned", "", 3), story([]int{1}, []int{1}, "abandoned"), nil, "neither killed nor drained", 0, 0},
		{"error unexplained", endedJob("error", "spool failed", 3), story([]int{1}, []int{1}, "error"), during, "only a full spool", 0, 0},
		{"app-made end", endedJob("abandoned", "its spool was lost", 3), story([]int{1}, []int{1}, ""), during, "without the runner's end record", 0, 0},
		{"failed", endedJob("failed", "exit 2", 3), story([]int{1}, []int{1}, "failed"), during, "no fault explains", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &Report{ByStatus: map[string]int{}}
			checkJob(tc.job, tc.recs, tc.faults, rep)
			got := strings.Join(rep.Violations, "\n")
			if tc.violation == "" && got != "" || tc.violation != "" && !strings.Contains(got, tc.violation) {
				t.Errorf("violations:\n%s\nwant one saying %q", got, tc.violation)
			}
			if rep.Duplicated != tc.dup || rep.Missing != tc.miss {
				t.Errorf("duplicated %d, missing %d; want %d, %d", rep.Duplicated, rep.Missing, tc.dup, tc.miss)
			}
		})
	}
}

// TestScheduleReplays: one seed gives one schedule, and its first faults are every kind once.
func TestScheduleReplays(t *testing.T) {
	cfg := &Config{Faults: 30, RTEs: 4, Kinds: Kinds, Gap: 3 * time.Second}
	draw := func(seed uint64) []fault {
		var out []fault
		for _, f := range schedule(rand.New(rand.NewPCG(seed, 1)), cfg) {
			out = append(out, *f)
		}
		return out
	}
	a, b := draw(7), draw(7)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed drew two schedules")
	}
	if reflect.DeepEqual(a, draw(8)) {
		t.Fatal("seeds 7 and 8 drew the same schedule")
	}
	seen := map[Kind]bool{}
	for _, f := range a[:len(Kinds)] {
		seen[f.Kind] = true
	}
	if len(seen) != len(Kinds) {
		t.Errorf("the first %d faults are %d kinds, want every kind once", len(Kinds), len(seen))
	}
}

func TestParseKinds(t *testing.T) {
	if ks, err := ParseKinds("all"); err != nil || len(ks) != len(Kinds) {
		t.Errorf("ParseKinds(all) = %v, %v", ks, err)
	}
	if ks, err := ParseKinds("cut, stall,cut"); err != nil || !reflect.DeepEqual(ks, []Kind{Cut, Stall}) {
		t.Errorf("ParseKinds(cut, stall,cut) = %v, %v; want [cut stall]", ks, err)
	}
	if _, err := ParseKinds("cut,explode"); err == nil || !strings.Contains(err.Error(), `"explode"`) {
		t.Errorf("ParseKinds(cut,explode) = %v, want an error naming explode", err)
	}
}

// TestLastSeqReadsTheSpoolFormat: the last whole frame's seq; a torn tail does not count.
func TestLastSeqReadsTheSpoolFormat(t *testing.T) {
	b := []byte(spoolHeader)
	for seq := 1; seq <= 3; seq++ {
		payload := fmt.Appendf(nil, `{"type":"record","job":"j","seq":%d,"kind":"output","data":{"text":"x"}}`, seq)
		b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
		b = append(b, 0, 0, 0, 0) // the checksum, which lastSeq does not check
		b = append(b, payload...)
	}
	if got := lastSeq(b); got != 3 {
		t.Errorf("lastSeq = %d, want 3", got)
	}
	torn := append(binary.BigEndian.AppendUint32(append([]byte(nil), b...), 500), 1, 2, 3, 4, '{')
	if got := lastSeq(torn); got != 3 {
		t.Errorf("lastSeq with a torn tail = %d, want 3", got)
	}
	if got := lastSeq([]byte("not a spool")); got != 0 {
		t.Errorf("lastSeq of another file = %d, want 0", got)
	}
}
