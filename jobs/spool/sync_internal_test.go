package spool

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// faultySync fails the syncs of files whose name ends in suffix while failing is set, and can
// hold a sync until released, to line Appends up behind it.
type faultySync struct {
	mu      sync.Mutex
	failing string        // suffix of the file names whose sync fails; "" for none
	hold    chan struct{} // when set, the next sync waits for it to close
	held    chan struct{} // closed when a sync is being held
}

func (fs *faultySync) sync(f *os.File) error {
	fs.mu.Lock()
	hold, held := fs.hold, fs.held
	fs.hold = nil
	fs.mu.Unlock()
	if hold != nil {
		close(held)
		<-hold
	}
	fs.mu.Lock()
	fail := fs.failing != "" && strings.HasSuffix(f.Name(), fs.failing)
	fs.mu.Unlock()
	if fail {
		return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EIO}
	}
	return f.Sync()
}

func (fs *faultySync) set(failing string) {
	fs.mu.Lock()
	fs.failing = failing
	fs.mu.Unlock()
}

func text(s string) json.RawMessage {
	b, _ := json.Marshal(protocol.OutputData{Text: s})
	return b
}

func readAll(t *testing.T, s *Spool, job string) []string {
	t.Helper()
	var out []string
	err := s.Pending(job, 0, func(rec protocol.Record, _ []byte) error {
		var d protocol.OutputData
		json.Unmarshal(rec.Data, &d)
		out = append(out, fmt.Sprintf("%d:%s", rec.Seq, d.Text))
		return nil
	})
	if err != nil {
		t.Fatalf("Pending(%s): %v", job, err)
	}
	return out
}

func TestFailedSyncCutsUnsyncedRecords(t *testing.T) {
	dir := t.TempDir()
	fs := &faultySync{}
	s, err := Open(dir, Options{fsync: fs.sync, RetryEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Append("j", protocol.KindOutput, text("one")); err != nil {
		t.Fatal(err)
	}

	// Hold the sync of record 2, line up records 3 and 4 behind it, then fail that sync: all
	// three must fail, since 3 and 4 were written after bytes that may never reach the disk.
	fs.mu.Lock()
	fs.hold, fs.held = make(chan struct{}), make(chan struct{})
	hold, held := fs.hold, fs.held
	fs.mu.Unlock()
	errs := make(chan error, 3)
	go func() { _, err := s.Append("j", protocol.KindOutput, text("lost")); errs <- err }()
	<-held
	for range 2 {
		go func() { _, err := s.Append("j", protocol.KindOutput, text("lost")); errs <- err }()
	}
	if !testenv.Poll(10*time.Second, func() bool { return s.Stats().Records >= 4 }) {
		t.Fatalf("the queued Appends never wrote: stats %+v", s.Stats())
	}
	fs.set("j.spool")
	close(hold)
	for range 3 {
		err := <-errs
		if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), filepath.Join(dir, "j.spool")) {
			t.Fatalf("Append whose sync failed: %v, want EIO naming the file", err)
		}
	}
	if err := s.Healthy(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Healthy after a failed sync = %v, want EIO", err)
	}
	fs.set("")

	rec, err := s.Append("j", protocol.KindOutput, text("two"))
	if err != nil || rec.Seq != 2 {
		t.Fatalf("Append after the failed sync = seq %d, %v; want seq 2, the failed seqs used again", rec.Seq, err)
	}
	// A successful append alone does not clear the failure; the next full-size test write does.
	if !testenv.Poll(10*time.Second, func() bool { return s.Healthy() == nil }) {
		t.Fatalf("Healthy after a sync succeeded again = %v", s.Healthy())
	}
	if got := fmt.Sprint(readAll(t, s, "j")); got != "[1:one 2:two]" {
		t.Fatalf("records after the failed sync = %s, want [1:one 2:two]", got)
	}
	s.Close()
	s2, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := fmt.Sprint(readAll(t, s2, "j")); got != "[1:one 2:two]" {
		t.Fatalf("records after reopen = %s, want [1:one 2:two]", got)
	}
}

func TestFailedDirSyncFailsTheFirstRecord(t *testing.T) {
	dir := t.TempDir()
	fs := &faultySync{}
	s, err := Open(dir, Options{fsync: fs.sync})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fs.set(filepath.Base(dir))
	if _, err := s.Append("j", protocol.KindOutput, text("x")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Append whose new file's directory could not be synced: %v, want EIO", err)
	}
	if s.Has("j") || len(s.Jobs()) != 0 {
		t.Fatalf("after a failed first record: Has = %v, Jobs = %v, want nothing", s.Has("j"), s.Jobs())
	}
	fs.set("")
	if rec, err := s.Append("j", protocol.KindOutput, text("x")); err != nil || rec.Seq != 1 {
		t.Fatalf("Append once the directory syncs = seq %d, %v; want seq 1", rec.Seq, err)
	}
}

func TestAckDropsOffsetsOfAckedRecords(t *testing.T) {
	s, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 5000 {
		if _, err := s.Append("j", protocol.KindOutput, text("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Ack("j", 4990); err != nil {
		t.Fatal(err)
	}
	j := s.jobs["j"]
	j.mu.Lock()
	n, c, base := len(j.offs), cap(j.offs), j.base
	j.mu.Unlock()
	if n != 10 || base != 4991 || c > 1024 {
		t.Fatalf("index after acking 4990 of 5000: %d offsets (capacity %d) from seq %d, want 10 from 4991 in a small slice", n, c, base)
	}
}

func TestEndedJobHoldsNoDescriptor(t *testing.T) {
	s, err := Open(t.TempDir(), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Append("j", protocol.KindOutput, text("x"))
	if _, err := s.Append("j", protocol.KindEnd, json.RawMessage(`{"status":"success","exit_code":0}`)); err != nil {
		t.Fatal(err)
	}
	j := s.jobs["j"]
	j.mu.Lock()
	open := j.f != nil
	j.mu.Unlock()
	if open {
		t.Fatal("the file of a job whose end is durable is still open")
	}
	if got := readAll(t, s, "j"); len(got) != 2 {
		t.Fatalf("records of the ended job = %v, want 2", got)
	}
}
