package spool_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

// smallDisk mounts a 256 KiB tmpfs for the test, or skips it where mounting is not allowed.
func smallDisk(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k,mode=0700"); err != nil {
		t.Skipf("cannot mount a 256 KiB tmpfs at %s (%v): the full-disk test needs root with CAP_SYS_ADMIN", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount the test tmpfs at %s: %v", dir, err)
		}
	})
	return dir
}

func TestFullDisk(t *testing.T) {
	dir := smallDisk(t)
	s, err := spool.Open(dir, spool.Options{RetryEvery: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// A finished job holds more than a record's worth of space, so that acking it frees room.
	for range 12 {
		mustAppend(t, s, "filler", protocol.KindOutput, output(strings.Repeat("f", 8000)))
	}
	fillerEnd := mustAppend(t, s, "filler", protocol.KindEnd, endData(protocol.StatusSuccess))

	var appended int64
	var full error
	for i := range 400 { // 400 x 2 KiB is three times the disk: the loop must end in ENOSPC
		_, err := s.Append("big", protocol.KindOutput, output(fmt.Sprintf("%04d%s", i, strings.Repeat("b", 2000))))
		if err != nil {
			full = err
			break
		}
		appended++
	}
	path := filepath.Join(dir, "big.spool")
	if full == nil {
		t.Fatal("appended 800 KiB to a 256 KiB disk without an error")
	}
	if !errors.Is(full, syscall.ENOSPC) || !strings.Contains(full.Error(), path) || !strings.Contains(full.Error(), "full") {
		t.Fatalf("Append on a full disk: %v, want ENOSPC naming %s and saying the spool is full", full, path)
	}
	t.Logf("the disk was full after %d records: %v", appended, full)
	if err := s.Healthy(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Healthy on a full disk = %v, want the ENOSPC error", err)
	}
	if _, err := s.Append("big", protocol.KindOutput, output(strings.Repeat("b", 2000))); err == nil {
		t.Fatal("a second Append on the still full disk succeeded")
	}
	wantSeqs(t, "records of big while the disk is full", pending(t, s, "big", 0), 1, appended)

	if err := s.Healthy(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Healthy, retrying on the still full disk = %v, want ENOSPC", err)
	}

	// Acking the finished job removes its file and frees room: Healthy's test write finds it
	// before anything is appended (an RTE refuses new jobs while the spool is unhealthy).
	if err := s.Ack("filler", fillerEnd.Seq); err != nil {
		t.Fatal(err)
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy after space was freed = %v, want nil", err)
	}
	rec, err := s.Append("big", protocol.KindOutput, output("after"))
	if err != nil {
		t.Fatalf("Append after space was freed: %v", err)
	}
	if rec.Seq != appended+1 {
		t.Fatalf("first record after the full disk got seq %d, want %d (the failed ones used none)", rec.Seq, appended+1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := open(t, dir, spool.Options{})
	recs := pending(t, s2, "big", 0)
	wantSeqs(t, "records of big after reopen", recs, 1, appended+1)
	for _, r := range recs[:appended] {
		if want := string(output(fmt.Sprintf("%04d%s", r.Seq-1, strings.Repeat("b", 2000)))); string(r.Data) != want {
			t.Fatalf("record %d after reopen is not the one appended", r.Seq)
		}
	}
}
