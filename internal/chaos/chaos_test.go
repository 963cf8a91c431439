package chaos

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/internal/testenv"
)

// TestChaosShortRun runs the harness for real with a fixed seed and one fault of each kind
// (spool-full only as root), and fails on any broken invariant, naming it.
func TestChaosShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the app, three RTEs and real ansible-playbook jobs for a minute or two")
	}
	if _, err := exec.LookPath("ansible-playbook"); err != nil {
		t.Skip("ansible-playbook is not on PATH: run scripts/deps")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	bin := t.TempDir()
	if err := testenv.Build(bin, "../..", false, "rte", "rte-app"); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	rep, err := Run(context.Background(), Config{
		Seed: 20261203, Faults: len(Kinds), RTEs: 3, Jobs: 3, Gap: 2 * time.Second,
		Out: filepath.Join(t.TempDir(), "run"), Settle: 3 * time.Minute,
		RTEBin: filepath.Join(bin, "rte"), AppBin: filepath.Join(bin, "rte-app"), Log: &log,
	})
	if err != nil {
		t.Fatalf("the harness did not run: %v\n%s", err, log.String())
	}
	var table strings.Builder
	rep.Write(&table)
	t.Logf("%s\n%s", log.String(), table.String())
	if rep.Failed() {
		t.Fatalf("%d invariants broke; the first: %s", len(rep.Violations), rep.Violations[0])
	}
	injected := map[Kind]int{}
	for _, f := range rep.Faults {
		if !f.Start.IsZero() {
			injected[f.Kind]++
		}
	}
	for _, k := range Kinds {
		if injected[k] == 0 && !(k == SpoolFull && len(rep.Skipped) > 0) {
			t.Errorf("no %s fault was injected", k)
		}
	}
	// A run that stored nothing would pass every check above.
	if rep.Jobs == 0 || rep.Lines == 0 || rep.Events == 0 || rep.Stored == 0 {
		t.Fatalf("the run stored %d jobs, %d lines, %d events, %d records: nothing was checked", rep.Jobs, rep.Lines, rep.Events, rep.Stored)
	}
}
