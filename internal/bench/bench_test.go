package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rte-project/rte/internal/testenv"
)

func TestMain(m *testing.M) {
	// The scale section starts this test binary again as the fake RTEs' process.
	ServeFakesFromEnv()
	goleak.VerifyTestMain(m)
}

// TestQuickRun runs every section once at tiny sizes against the real binaries, ansible and
// ansible-runner, and checks that what each measured is whole: every tool ran both playbooks,
// the store held exactly what the stand-ins produced (Run fails otherwise; checked again
// here), every job ran, every socket connected. It asserts no time.
func TestQuickRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the app and the RTE several times and runs ansible: not in -short")
	}
	for _, tool := range []string{"ansible-playbook", "ansible-runner"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/deps installs ansible-core and python3-ansible-runner): %v", tool, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := testenv.Build(bin, "../..", false, "rte", "rte-app"); err != nil {
		t.Fatal(err)
	}
	var progress testenv.Buffer
	o := Options{
		Command: "test", Rounds: 1, Root: "../..", Work: t.TempDir(), Self: self,
		Bin:    Binaries{RTE: filepath.Join(bin, "rte"), App: filepath.Join(bin, "rte-app")},
		Peers:  PeerSizes{Tasks: 3, Hosts: 2, OutputLines: 2000},
		Record: 3 << 20, Disk: 4 << 20, Events: 1500, Jobs: 4, Sockets: 6, Files: 200, Progress: &progress,
	}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatalf("%v\nprogress:\n%s", err, progress.String())
	}
	if len(res.Peers) != 6 {
		t.Errorf("%d peer runs, want 2 playbooks × 3 tools", len(res.Peers))
	}
	for _, p := range res.Peers {
		if p.Failed != "" {
			t.Errorf("%s by %s was left out: %s", p.Playbook, p.Tool, p.Failed)
		}
		if p.Wall <= 0 || p.Usage.CPU <= 0 || p.Usage.MaxRSS <= 0 {
			t.Errorf("%s by %s: wall %s, CPU %s, peak %d: a measure is missing", p.Playbook, p.Tool, p.Wall, p.Usage.CPU, p.Usage.MaxRSS)
		}
		if p.Tool == ToolRTE && (p.Peaks["rte"] <= 0 || p.Peaks["rte-app serve"] <= 0) {
			t.Errorf("%s by the RTE: per-process peaks %v", p.Playbook, p.Peaks)
		}
	}
	if res.Record == nil || len(res.Record.Flows) != 1 || len(res.Record.Disk) != 2 || res.Record.Spool.Records == 0 {
		t.Fatalf("record path: %+v", res.Record)
	}
	if f := res.Record.Flows[0]; f.Stored.OutputBytes != o.Record || f.Stored.Status != "success" {
		t.Errorf("record path: stored %d bytes (end %q), the stand-in printed %d", f.Stored.OutputBytes, f.Stored.Status, o.Record)
	}
	if len(res.Events) != 1 || res.Events[0].Stored.Events != int64(o.Events) {
		t.Errorf("events: %+v, want %d stored", res.Events, o.Events)
	}
	if s := res.Scale; s == nil || s.Connected != o.Sockets || s.RTEJobsRSS <= 0 || s.AppSockRSS <= 0 {
		t.Errorf("scale: %+v", res.Scale)
	}
	if f := res.Files; f == nil || f.NewFrames < 1 || f.NewFrames >= f.AllFrames || f.Frames >= f.Whole || f.FileAlone <= 0 {
		t.Errorf("files: %+v, want some but not all frames new", res.Files)
	}
	table := res.Markdown()
	for _, want := range []string{"RTE path / ansible-playbook", "events/s", "MB/s", "per socket", "per job", "bundle.frames", "ansible-runner"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table has no %q:\n%s", want, table)
		}
	}
}

func TestWriteBetweenMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.md")
	if err := os.WriteFile(path, []byte("# B\n\nbefore\n"+MarkBegin+"\nold\n"+MarkEnd+"\nafter\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteBetweenMarkers(path, "new table\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := "# B\n\nbefore\n" + MarkBegin + "\nnew table\n" + MarkEnd + "\nafter\n"; string(b) != want {
		t.Errorf("got\n%s\nwant\n%s", b, want)
	}
	if err := os.WriteFile(path, []byte("no markers\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteBetweenMarkers(path, "x"); err == nil || !strings.Contains(err.Error(), MarkBegin) {
		t.Errorf("a file without the markers: %v", err)
	}
}

func TestCheckOnly(t *testing.T) {
	if err := CheckOnly([]string{"peers", "scale"}); err != nil {
		t.Error(err)
	}
	if err := CheckOnly([]string{"record", "disk"}); err == nil || !strings.Contains(err.Error(), `"disk"`) {
		t.Errorf("an unknown section: %v", err)
	}
}
