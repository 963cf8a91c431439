package spool_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open opens dir as a spool and closes it when the test ends.
func open(t testing.TB, dir string, opts spool.Options) *spool.Spool {
	t.Helper()
	s, err := spool.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func output(text string) json.RawMessage {
	b, _ := json.Marshal(protocol.OutputData{Text: text})
	return b
}

func endData(status string) json.RawMessage {
	b, _ := json.Marshal(protocol.EndData{Status: status})
	return b
}

func mustAppend(t testing.TB, s *spool.Spool, job, kind string, data json.RawMessage) protocol.Record {
	t.Helper()
	rec, err := s.Append(job, kind, data)
	if err != nil {
		t.Fatalf("Append(%s, %s): %v", job, kind, err)
	}
	return rec
}

// pending collects every pending record of job after seq after.
func pending(t testing.TB, s *spool.Spool, job string, after int64) []protocol.Record {
	t.Helper()
	var out []protocol.Record
	err := s.Pending(job, after, func(rec protocol.Record, frame []byte) error {
		out = append(out, rec)
		return nil
	})
	if err != nil {
		t.Fatalf("Pending(%s, %d): %v", job, after, err)
	}
	return out
}

// seqs lists the seqs of recs.
func seqs(recs []protocol.Record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.Seq
	}
	return out
}

func wantSeqs(t testing.TB, what string, recs []protocol.Record, from, to int64) {
	t.Helper()
	got := seqs(recs)
	ok := int64(len(got)) == max(0, to-from+1)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i] == from+int64(i)
	}
	if !ok {
		t.Fatalf("%s: got seqs %v, want %d to %d in order", what, got, from, to)
	}
}

func TestConcurrentAppendsGetEverySeqOnce(t *testing.T) {
	s := open(t, t.TempDir(), spool.Options{})
	const workers, each = 8, 40
	var mu sync.Mutex
	seen := map[string]map[int64]string{"shared": {}, "own-0": {}, "own-1": {}, "own-2": {}, "own-3": {}, "own-4": {}, "own-5": {}, "own-6": {}, "own-7": {}}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				// Half the records go to one job all workers share, half to the worker's own.
				job := "shared"
				if i%2 == 1 {
					job = fmt.Sprintf("own-%d", w)
				}
				text := fmt.Sprintf("w%d i%d", w, i)
				rec, err := s.Append(job, protocol.KindOutput, output(text))
				if err != nil {
					t.Errorf("Append(%s): %v", job, err)
					return
				}
				mu.Lock()
				if prev, dup := seen[job][rec.Seq]; dup {
					t.Errorf("job %s seq %d given twice: to %q and %q", job, rec.Seq, prev, text)
				}
				seen[job][rec.Seq] = text
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for job, bySeq := range seen {
		recs := pending(t, s, job, 0)
		wantSeqs(t, "pending of "+job, recs, 1, int64(len(bySeq)))
		for _, r := range recs {
			var d protocol.OutputData
			if err := json.Unmarshal(r.Data, &d); err != nil || d.Text != bySeq[r.Seq] {
				t.Fatalf("job %s seq %d on disk holds %s, want the text Append returned it for, %q", job, r.Seq, r.Data, bySeq[r.Seq])
			}
		}
	}
	if n := len(seen["shared"]); n != workers*each/2 {
		t.Fatalf("shared job got %d records, want %d", n, workers*each/2)
	}
	st := s.Stats()
	if st.Records != workers*each || st.Syncs == 0 {
		t.Fatalf("stats %+v: want %d records and some syncs", st, workers*each)
	}
}

func TestReopenSeesEverythingDurable(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.FixedZone("CET", 3600))
	s, err := spool.Open(dir, spool.Options{Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	start, _ := json.Marshal(protocol.StartData{PID: 42, Instance: "rte01", Playbook: "site.yml"})
	first := mustAppend(t, s, "1042", protocol.KindStart, start)
	if !first.At.Equal(at) || first.At.Location() != time.UTC {
		t.Fatalf("record at %v, want %v in UTC", first.At, at)
	}
	for i := range 5 {
		mustAppend(t, s, "1042", protocol.KindOutput, output(fmt.Sprintf("line %d\n", i)))
	}
	mustAppend(t, s, "done", protocol.KindLog, json.RawMessage(`{"level":"info","message":"x"}`))
	mustAppend(t, s, "done", protocol.KindEnd, endData(protocol.StatusSuccess))
	if err := s.Ack("1042", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil", err)
	}
	if _, err := s.Append("1042", protocol.KindOutput, output("late")); !errors.Is(err, spool.ErrClosed) {
		t.Fatalf("Append after Close: %v, want ErrClosed", err)
	}

	s2 := open(t, dir, spool.Options{})
	want := []spool.JobState{{Job: "1042", LastSeq: 6}, {Job: "done", LastSeq: 2, Ended: true}}
	got := s2.Jobs()
	for i := range got {
		// Nothing is acked after a reopen: every record waits, the first since its own time.
		if got[i].WaitingBytes <= 0 || !got[i].OldestWaiting.Equal(at) {
			t.Fatalf("Jobs after reopen: %s waits %d bytes since %v, want its whole file since %v", got[i].Job, got[i].WaitingBytes, got[i].OldestWaiting, at)
		}
		got[i].WaitingBytes, got[i].OldestWaiting = 0, time.Time{}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Jobs after reopen = %+v, want %+v (acks are not kept across a restart)", got, want)
	}
	if got := fmt.Sprint(s2.Progress()); got != "[{1042 6} {done 2}]" {
		t.Fatalf("Progress after reopen = %s, want [{1042 6} {done 2}]", got)
	}
	recs := pending(t, s2, "1042", 0)
	wantSeqs(t, "pending after reopen", recs, 1, 6)
	if recs[0].Kind != protocol.KindStart || !recs[0].At.Equal(at) || string(recs[0].Data) != string(start) {
		t.Fatalf("first record after reopen = %+v, want the start record at %v with %s", recs[0], at, start)
	}
	if rec := mustAppend(t, s2, "1042", protocol.KindOutput, output("more")); rec.Seq != 7 {
		t.Fatalf("first Append after reopen got seq %d, want 7", rec.Seq)
	}
	if _, err := s2.Append("done", protocol.KindOutput, output("after end")); err == nil || !strings.Contains(err.Error(), "end record") {
		t.Fatalf("Append after the end record: %v, want a refusal naming the end record", err)
	}
	if err := s2.Ack("done", 2); err != nil {
		t.Fatalf("Ack of a restored ended job: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "done.spool")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file of a restored job after its end was acked: %v, want it removed", err)
	}
}

func TestCloseWaitsForAppendsInFlight(t *testing.T) {
	dir := t.TempDir()
	s, err := spool.Open(dir, spool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stored := make([]int64, 4)
	var wg sync.WaitGroup
	for w := range stored {
		wg.Go(func() {
			for {
				rec, err := s.Append(fmt.Sprintf("j%d", w), protocol.KindOutput, output("x"))
				if errors.Is(err, spool.ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Append: %v", err)
					return
				}
				stored[w] = rec.Seq
			}
		})
	}
	for s.Stats().Records < 20 {
		time.Sleep(time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s2 := open(t, dir, spool.Options{})
	for w, last := range stored {
		wantSeqs(t, fmt.Sprintf("records of j%d after Close and reopen", w), pending(t, s2, fmt.Sprintf("j%d", w), 0), 1, last)
	}
}

func TestAckTrimsAndRemovesTheEndedJob(t *testing.T) {
	dir := t.TempDir()
	core, logs := observer.New(zapcore.DebugLevel)
	s := open(t, dir, spool.Options{Logger: zap.New(core), NoSync: true})
	for i := range 4 {
		mustAppend(t, s, "j1", protocol.KindOutput, output(fmt.Sprint(i)))
	}
	if err := s.Ack("j1", 2); err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "pending after ack 2", pending(t, s, "j1", 0), 3, 4)
	if err := s.Ack("j1", 1); err != nil {
		t.Fatalf("an older ack: %v, want nil", err)
	}
	wantSeqs(t, "pending after an older ack", pending(t, s, "j1", 0), 3, 4)
	if err := s.Ack("j1", 99); err != nil {
		t.Fatalf("ack beyond the last seq: %v, want nil", err)
	}
	if logs.FilterMessageSnippet("beyond").Len() != 1 {
		t.Fatalf("ack beyond the last seq: want one debug log about it, got %v", logs.All())
	}
	wantSeqs(t, "pending after an ack beyond the end", pending(t, s, "j1", 0), 3, 4)
	if err := s.Ack("nobody", 3); err != nil {
		t.Fatalf("ack of an unknown job: %v, want nil", err)
	}

	end := mustAppend(t, s, "j1", protocol.KindEnd, endData(protocol.StatusFailed))
	path := filepath.Join(dir, "j1.spool")
	if err := s.Ack("j1", end.Seq-1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("job file after acking all but the end: %v, want it kept", err)
	}
	if !s.Has("j1") {
		t.Fatal("Has(j1) = false before the end is acked")
	}
	if err := s.Ack("j1", end.Seq); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("job file after acking the end: %v, want it removed", err)
	}
	if s.Has("j1") || len(s.Jobs()) != 0 {
		t.Fatalf("after the end is acked: Has = %v, Jobs = %v, want the job gone", s.Has("j1"), s.Jobs())
	}
	if err := s.Pending("j1", 0, func(protocol.Record, []byte) error { return errors.New("called") }); err != nil {
		t.Fatalf("Pending of a removed job: %v, want nothing pending", err)
	}
	if _, err := s.Append("j1", protocol.KindOutput, output("late")); err == nil {
		t.Fatal("Append to a removed job succeeded; want it refused, since its id is used")
	}
}

func TestPendingOrderFramesAndResume(t *testing.T) {
	s := open(t, t.TempDir(), spool.Options{NoSync: true})
	for i := range 10 {
		mustAppend(t, s, "j", protocol.KindOutput, output(fmt.Sprintf("%d", i+1)))
	}
	var got []protocol.Record
	err := s.Pending("j", 4, func(rec protocol.Record, frame []byte) error {
		m, err := protocol.Decode(frame)
		if err != nil {
			return fmt.Errorf("frame of seq %d does not decode: %w", rec.Seq, err)
		}
		wire, ok := m.(*protocol.Record)
		want, _ := protocol.Encode(rec)
		if !ok || wire.Seq != rec.Seq || string(frame) != string(want) {
			return fmt.Errorf("frame %s, want the encoding of record %d: %s", frame, rec.Seq, want)
		}
		var d protocol.OutputData
		json.Unmarshal(rec.Data, &d)
		if d.Text != fmt.Sprint(rec.Seq) {
			return fmt.Errorf("record %d holds %q", rec.Seq, d.Text)
		}
		got = append(got, rec)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "pending after 4", got, 5, 10)

	stop := errors.New("socket gone")
	calls := 0
	err = s.Pending("j", 0, func(rec protocol.Record, _ []byte) error {
		calls++
		if rec.Seq == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("Pending with fn failing at seq 3: err %v after %d calls, want fn's error after 3 calls", err, calls)
	}
	wantSeqs(t, "pending after the last", pending(t, s, "j", 10), 1, 0)
	wantSeqs(t, "pending after a negative seq", pending(t, s, "j", -5), 1, 10)
}

func TestAppendRefusals(t *testing.T) {
	s := open(t, t.TempDir(), spool.Options{NoSync: true})
	mustAppend(t, s, "ended", protocol.KindEnd, endData(protocol.StatusSuccess))
	for _, tc := range []struct {
		name, job, kind string
		data            string
		want            string
	}{
		{"path in job id", "../etc", protocol.KindOutput, `{"text":"x"}`, "job"},
		{"empty job id", "", protocol.KindOutput, `{"text":"x"}`, "job"},
		{"long job id", strings.Repeat("a", 129), protocol.KindOutput, `{"text":"x"}`, "job"},
		{"unknown kind", "j", "chatter", `{"text":"x"}`, "kind"},
		{"data not an object", "j", protocol.KindOutput, `"x"`, "data"},
		{"data not JSON", "j", protocol.KindOutput, `{"text":`, "data"},
		{"after the end", "ended", protocol.KindOutput, `{"text":"x"}`, "end record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Append(tc.job, tc.kind, json.RawMessage(tc.data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Append(%q, %q, %s) = %v, want an error about %s", tc.job, tc.kind, tc.data, err, tc.want)
			}
		})
	}
	if s.Has("j") {
		t.Fatal("a refused first record left job j in the spool")
	}
	if rec := mustAppend(t, s, "j", protocol.KindOutput, output("ok")); rec.Seq != 1 {
		t.Fatalf("first good record after refusals got seq %d, want 1", rec.Seq)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("refused input made the spool unhealthy: %v", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	t.Run("in use", func(t *testing.T) {
		dir := t.TempDir()
		open(t, dir, spool.Options{})
		if s, err := spool.Open(dir, spool.Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("second Open of a spool in use: %v, want it refused", err)
		}
	})
	t.Run("not a spool file", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "j.spool")
		os.WriteFile(path, []byte("some other program's data\n"), 0o600)
		if _, err := spool.Open(dir, spool.Options{}); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("Open with a foreign .spool file: %v, want an error naming %s", err, path)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("the foreign file is gone (%v); Open must leave it to the operator", err)
		}
	})
	t.Run("path is a file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "f")
		os.WriteFile(path, nil, 0o600)
		if _, err := spool.Open(path, spool.Options{}); err == nil || !strings.Contains(err.Error(), "not a directory") {
			t.Fatalf("Open of a plain file: %v, want a not-a-directory error", err)
		}
	})
}

func TestOpenCreatesPrivateDirAndFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "spool")
	s := open(t, dir, spool.Options{})
	mustAppend(t, s, "j", protocol.KindOutput, output("secret output"))
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, "j.spool"): 0o600} {
		info, err := os.Stat(path)
		if err != nil || info.Mode().Perm() != want {
			t.Fatalf("mode of %s: %v %v, want %v", path, info.Mode().Perm(), err, want)
		}
	}
}

func TestOpenIgnoresOtherFilesAndDropsEmptyJobs(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "not a job.spool"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600)
	os.Mkdir(filepath.Join(dir, "lost+found"), 0o700)
	os.WriteFile(filepath.Join(dir, "torn-header.spool"), []byte("RTE sp"), 0o600)
	os.WriteFile(filepath.Join(dir, "header-only.spool"), []byte("RTE spool 1\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "zero.spool"), nil, 0o600)
	s := open(t, dir, spool.Options{})
	if jobs := s.Jobs(); len(jobs) != 0 {
		t.Fatalf("Jobs = %v, want none", jobs)
	}
	for _, name := range []string{"torn-header.spool", "header-only.spool", "zero.spool"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after Open: %v, want it removed (no record was ever in it)", name, err)
		}
	}
	for _, name := range []string{"not a job.spool", "notes.txt"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s after Open: %v, want it left alone", name, err)
		}
	}
	if rec := mustAppend(t, s, "torn-header", protocol.KindOutput, output("x")); rec.Seq != 1 {
		t.Fatalf("job whose file held no record restarted at seq %d, want 1", rec.Seq)
	}
}

func TestTornTailIsCut(t *testing.T) {
	for _, tc := range []struct {
		name string
		// damage changes the file, whose last frame starts at last.
		damage func(t *testing.T, path string, last int64, size int64)
		keep   int64 // records that survive
	}{
		{"half a frame header", func(t *testing.T, path string, last, size int64) { truncate(t, path, last+4) }, 2},
		{"half a payload", func(t *testing.T, path string, last, size int64) { truncate(t, path, last+(size-last)/2) }, 2},
		{"flipped byte in the payload", func(t *testing.T, path string, last, size int64) { flip(t, path, size-3) }, 2},
		{"flipped byte in the length", func(t *testing.T, path string, last, size int64) { flip(t, path, last+3) }, 2},
		{"flipped byte in the checksum", func(t *testing.T, path string, last, size int64) { flip(t, path, last+5) }, 2},
		{"zeros after the last frame", func(t *testing.T, path string, last, size int64) { appendBytes(t, path, make([]byte, 4096)) }, 3},
		{"garbage after the last frame", func(t *testing.T, path string, last, size int64) {
			appendBytes(t, path, []byte("\x00\x00\x00\x05abcdefghij"))
		}, 3},
		{"flipped byte in the first record", func(t *testing.T, path string, last, size int64) { flip(t, path, 12+10) }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, err := spool.Open(dir, spool.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				mustAppend(t, s, "j", protocol.KindOutput, output(fmt.Sprintf("record %d", i+1)))
			}
			s.Close()
			path := filepath.Join(dir, "j.spool")
			last := lastFrameOffset(t, path)
			info, _ := os.Stat(path)
			tc.damage(t, path, last, info.Size())

			core, logs := observer.New(zapcore.WarnLevel)
			s2 := open(t, dir, spool.Options{Logger: zap.New(core)})
			recs := pending(t, s2, "j", 0)
			wantSeqs(t, "records after reopen", recs, 1, tc.keep)
			for _, r := range recs {
				if want := string(output(fmt.Sprintf("record %d", r.Seq))); string(r.Data) != want {
					t.Fatalf("record %d after reopen holds %s, want %s", r.Seq, r.Data, want)
				}
			}
			if tc.keep < 3 && logs.FilterMessageSnippet("damaged tail").Len() != 1 {
				t.Fatalf("want one warning about the cut tail, got %v", logs.All())
			}
			if rec := mustAppend(t, s2, "j", protocol.KindOutput, output("after")); rec.Seq != tc.keep+1 {
				t.Fatalf("Append after the cut got seq %d, want %d", rec.Seq, tc.keep+1)
			}
			s2.Close()
			s3 := open(t, dir, spool.Options{})
			wantSeqs(t, "records after a second reopen", pending(t, s3, "j", 0), 1, tc.keep+1)
		})
	}
}

func TestTailAfterEndIsCut(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, spool.Options{NoSync: true})
	mustAppend(t, s, "j", protocol.KindOutput, output("a"))
	mustAppend(t, s, "j", protocol.KindEnd, endData(protocol.StatusSuccess))
	s.Close()
	path := filepath.Join(dir, "j.spool")
	// A well-formed frame of seq 3 after the end: only a bug or a hand edit makes one.
	b, _ := os.ReadFile(path)
	last := lastFrameOffset(t, path)
	appendBytes(t, path, b[last:])
	s2 := open(t, dir, spool.Options{})
	if got := s2.Jobs(); len(got) != 1 || got[0].LastSeq != 2 || !got[0].Ended {
		t.Fatalf("Jobs = %+v, want j ended at seq 2", got)
	}
	info, _ := os.Stat(path)
	if info.Size() != int64(len(b)) {
		t.Fatalf("file is %d bytes after Open, want %d (the frame after the end cut)", info.Size(), len(b))
	}
}

func TestChangedIsSignalledAfterAppend(t *testing.T) {
	s := open(t, t.TempDir(), spool.Options{NoSync: true})
	select {
	case <-s.Changed():
		t.Fatal("Changed signalled before any Append")
	default:
	}
	for range 3 {
		mustAppend(t, s, "j", protocol.KindOutput, output("x"))
	}
	select {
	case <-s.Changed():
	default:
		t.Fatal("Changed not signalled after Append returned")
	}
}

// TestSessionLoop runs appenders and a session-like reader side by side: the reader waits on
// Changed, sends what is pending, acks it, and must see every record exactly once, in order,
// until every job's end is acked and its file removed.
func TestSessionLoop(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, spool.Options{})
	const jobs, each = 4, 60
	var wg sync.WaitGroup
	for n := range jobs {
		wg.Go(func() {
			job := fmt.Sprintf("job-%d", n)
			for i := range each {
				if _, err := s.Append(job, protocol.KindOutput, output(fmt.Sprint(i))); err != nil {
					t.Errorf("Append: %v", err)
					return
				}
			}
			if _, err := s.Append(job, protocol.KindEnd, endData(protocol.StatusSuccess)); err != nil {
				t.Errorf("Append end: %v", err)
			}
		})
	}
	sent := map[string]int64{}
	removed := 0
	deadline := time.After(20 * time.Second) // a safety net, not a measurement
	for removed < jobs {
		select {
		case <-s.Changed():
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("reader stuck: sent %v, %d jobs removed, Jobs = %+v", sent, removed, s.Jobs())
		}
		for _, js := range s.Jobs() {
			err := s.Pending(js.Job, sent[js.Job], func(rec protocol.Record, _ []byte) error {
				if rec.Seq != sent[js.Job]+1 {
					return fmt.Errorf("job %s: got seq %d after %d", js.Job, rec.Seq, sent[js.Job])
				}
				sent[js.Job] = rec.Seq
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Ack(js.Job, sent[js.Job]); err != nil {
				t.Fatal(err)
			}
			if !s.Has(js.Job) {
				removed++ // its end was acked just now: Jobs will not list it again
			}
		}
	}
	wg.Wait()
	for n := range jobs {
		job := fmt.Sprintf("job-%d", n)
		if sent[job] != each+1 {
			t.Fatalf("job %s: reader got %d records, want %d", job, sent[job], each+1)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".spool") {
			t.Fatalf("%s left in the spool after every end was acked", e.Name())
		}
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, path string, extra []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(extra); err != nil {
		t.Fatal(err)
	}
}

// lastFrameOffset walks a well-formed spool file by its length fields.
func lastFrameOffset(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off, last := int64(len("RTE spool 1\n")), int64(-1)
	for off < int64(len(b)) {
		last = off
		n := int64(b[off])<<24 | int64(b[off+1])<<16 | int64(b[off+2])<<8 | int64(b[off+3])
		off += 8 + n
	}
	if last < 0 {
		t.Fatalf("%s holds no frame", path)
	}
	return last
}

// TestWaitingBytesAndAge: Jobs says how many bytes of durable records wait for an ack and the
// time of the oldest of them, and both follow the acks.
func TestWaitingBytesAndAge(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	now := at
	s := open(t, dir, spool.Options{Now: func() time.Time { return now }})
	for i := range 3 {
		now = at.Add(time.Duration(i) * time.Minute)
		mustAppend(t, s, "j", protocol.KindOutput, output(fmt.Sprintf("line %d\n", i)))
	}
	info, err := os.Stat(filepath.Join(dir, "j.spool"))
	if err != nil {
		t.Fatal(err)
	}
	waiting := func() spool.JobState {
		t.Helper()
		jobs := s.Jobs()
		if len(jobs) != 1 {
			t.Fatalf("Jobs = %+v, want job j", jobs)
		}
		return jobs[0]
	}
	all := waiting()
	if all.WaitingBytes <= 0 || all.WaitingBytes >= info.Size() || !all.OldestWaiting.Equal(at) {
		t.Fatalf("nothing acked: %d bytes waiting since %v; want most of the file's %d bytes since %v", all.WaitingBytes, all.OldestWaiting, info.Size(), at)
	}
	if err := s.Ack("j", 1); err != nil {
		t.Fatal(err)
	}
	one := waiting()
	if one.WaitingBytes <= 0 || one.WaitingBytes >= all.WaitingBytes || !one.OldestWaiting.Equal(at.Add(time.Minute)) {
		t.Fatalf("seq 1 acked: %d bytes waiting since %v; want fewer than %d since %v", one.WaitingBytes, one.OldestWaiting, all.WaitingBytes, at.Add(time.Minute))
	}
	if err := s.Ack("j", 3); err != nil {
		t.Fatal(err)
	}
	if none := waiting(); none.WaitingBytes != 0 || !none.OldestWaiting.IsZero() {
		t.Fatalf("everything acked: %d bytes waiting since %v, want none", none.WaitingBytes, none.OldestWaiting)
	}
}
