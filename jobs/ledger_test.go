package jobs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestLedgerRemembersAcrossReopen: an id added is remembered by a ledger opened later from
// the same file, until RanRetention has passed; a torn last line is dropped, not fatal.
func TestLedgerRemembersAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ran-jobs")
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	l, err := openLedger(path, zap.NewNop(), clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.add("job-1"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if err := l.add("job-2"); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1800003600 job-3") // torn: no newline, but whole; then garbage
	f.WriteString("\nxx ..\n17")
	f.Close()

	l2, err := openLedger(path, zap.NewNop(), clock)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	for _, id := range []string{"job-1", "job-2", "job-3"} {
		if _, ok := l2.ran(id); !ok {
			t.Errorf("after reopen, %s is not remembered", id)
		}
	}
	if _, ok := l2.ran(".."); ok {
		t.Error("a line with the id .. was taken")
	}
	now = now.Add(RanRetention - time.Minute)
	if _, ok := l2.ran("job-1"); ok {
		t.Error("job-1 is remembered past RanRetention")
	}
	if _, ok := l2.ran("job-2"); !ok {
		t.Error("job-2 was forgotten before RanRetention passed")
	}
	l3, err := openLedger(path, zap.NewNop(), clock)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "job-1") || !strings.Contains(string(data), "job-2") {
		t.Errorf("the rewrite at open kept expired ids or lost live ones:\n%s", data)
	}
	if _, ok := l3.ran("job-2"); !ok {
		t.Error("job-2 lost by the rewrite")
	}
	if info, _ := os.Stat(path); info.Mode().Perm() != 0o600 {
		t.Errorf("ledger mode %v, want 0600", info.Mode().Perm())
	}
}

// TestLedgerRefusesForeignFile: a file the RTE did not write is not read as a ledger.
func TestLedgerRefusesForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ran-jobs")
	os.WriteFile(path, []byte("root:x:0:0\n"), 0o600)
	if _, err := openLedger(path, zap.NewNop(), time.Now); err == nil || !strings.Contains(err.Error(), "was not written by the RTE") {
		t.Fatalf("openLedger on a foreign file = %v, want a refusal naming it", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "root:x:0:0\n" {
		t.Fatalf("the foreign file was changed: %q", data)
	}
}

// TestLedgerBounded: past MaxRan the oldest ids are forgotten, and the file is rewritten
// rather than growing without end.
func TestLedgerBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes MaxRan+10 lines")
	}
	l, _ := openLedger("", zap.NewNop(), time.Now)
	for i := range MaxRan + 10 {
		l.remember("j"+strings.Repeat("x", i%3)+time.Duration(i).String(), time.Now())
	}
	if len(l.ended) != MaxRan || len(l.order) > 2*MaxRan {
		t.Fatalf("%d ids kept, order %d; want %d and at most %d", len(l.ended), len(l.order), MaxRan, 2*MaxRan)
	}
	if _, ok := l.ran("j0s"); ok {
		t.Error("the oldest id is still remembered past MaxRan")
	}
}

// TestPassEnvNeverPassesTokens: whatever RTE_JOB_ENV_ALLOW says, the RTE's tokens stay out.
func TestPassEnvNeverPassesTokens(t *testing.T) {
	environ := []string{"PATH=/bin", "RTE_TOKEN=t", "RTE_NAME=n", "METRICS_TOKEN=m", "LC_ALL=C", "ANSIBLE_FORKS=3", "SECRET=s"}
	got := PassEnv(environ, []string{"PATH", "RTE_*", "LC_*", "METRICS_TOKEN"})
	want := []string{"PATH=/bin", "RTE_NAME=n", "LC_ALL=C"}
	if !slices.Equal(got, want) {
		t.Fatalf("PassEnv = %q, want %q", got, want)
	}
}

// TestCheckEnvAllow: a guarded name is accepted only when the operator lists it exactly.
func TestCheckEnvAllow(t *testing.T) {
	env := map[string]string{"ANSIBLE_PRIVATE_KEY_FILE": "/keys/id", "ANSIBLE_HOST_KEY_CHECKING": "False"}
	if err := checkEnv(env, nil, []string{"ANSIBLE_*"}); err == nil || !strings.Contains(err.Error(), "env.ANSIBLE_PRIVATE_KEY_FILE") {
		t.Fatalf("a pattern unlocked a guarded name: %v", err)
	}
	if err := checkEnv(env, nil, []string{"ANSIBLE_PRIVATE_KEY_FILE"}); err != nil {
		t.Fatalf("a guarded name listed exactly was refused: %v", err)
	}
	if err := checkEnv(map[string]string{"ANSIBLE_LOCAL_TEMP": "/x"}, []string{"ANSIBLE_LOCAL_TEMP"}, []string{"ANSIBLE_LOCAL_TEMP"}); err == nil {
		t.Fatal("RTE_JOB_ENV_ALLOW unlocked a name the RTE sets itself")
	}
}
