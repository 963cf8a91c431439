package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// bigPlaybooks copies e2e/testdata's playbooks and adds 2,000 files of YAML-like text across
// roles/ (about 4 MB): a repository where one changed file should not cost the whole bundle.
func bigPlaybooks(t testing.TB, src *packSource) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "big")
	if err := os.CopyFS(dir, os.DirFS(src.playbooks)); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("name when become loop item register vars hosts tasks handlers notify template src dest mode owner state present absent restarted enabled")
	for i := range 2000 {
		var b strings.Builder
		for b.Len() < 1000+r.IntN(3000) {
			fmt.Fprintf(&b, "%s- %s: %s %d\n", strings.Repeat("  ", r.IntN(3)), words[r.IntN(len(words))], words[r.IntN(len(words))], r.IntN(100000))
		}
		p := filepath.Join(dir, "roles", fmt.Sprintf("role%03d", i/20), "tasks", fmt.Sprintf("file%04d.yml", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// sayAgain changes hello.yml in dir so the job prints "hello <word> ..." before what it printed
// so far: one changed file.
func sayAgain(t testing.TB, dir, word string) {
	t.Helper()
	p := filepath.Join(dir, "hello.yml")
	changed := strings.Replace(readFile(t, p), `msg: "hello `, `msg: "hello `+word+" ", 1)
	if err := os.WriteFile(p, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	// Older than the packer's racy window, so the tree is remembered like a settled checkout.
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
}

// zstdSize is what data compresses to alone, at the packer's level: the floor for a transfer
// of one changed file.
func zstdSize(t testing.TB, data []byte) int {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return len(enc.EncodeAll(data, nil))
}

// TestTransferByFrames runs the bundle.frames feature with the real RTE, the real app half
// and real ansible-playbook over a real socket: a 2,000-file directory is sent whole once;
// after one file changes the next job gets only about that file's frame, counted as bytes the
// app read of the bundle and as bytes on the wire towards the RTE. A lying frame index fails
// the whole bundle's hash and the RTE asks for it whole; an app without the feature sends
// whole bundles to the same RTE build, as before.
func TestTransferByFrames(t *testing.T) {
	src := newPackSource(t)
	dir := bigPlaybooks(t, src)
	transfer := func(cache string) rigOption {
		return withRTEEnv("RTE_FILES=transfer", "RTE_CACHE_PATH="+cache, "RTE_CACHE_MB=256")
	}
	hello := protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"}}
	run := func(r *jobRig, id, wantOutput string) *app.Job {
		t.Helper()
		src.useDir(id, dir)
		js := hello
		js.Job = id
		r.submit(js)
		j := r.waitEnd(id, 3*time.Minute)
		if j.Status != protocol.StatusSuccess {
			t.Fatalf("job %s ended %s: %s", id, j.Status, j.Message)
		}
		if out := r.story(id).Output; !strings.Contains(out, wantOutput) {
			t.Fatalf("job %s did not run the playbook it was sent (want %q in its output):\n%s", id, wantOutput, out)
		}
		j, _ = r.App.GetJob(context.Background(), id)
		return j
	}
	// measure runs a job and returns its playbooks bundle, the bytes the app read of bundles
	// for it (what it sent) and the bytes that went towards the RTE on the wire meanwhile.
	measure := func(r *jobRig, id, wantOutput string) (protocol.BundleRef, int64, int64) {
		t.Helper()
		_, sent0 := src.counts()
		wire0 := r.Proxy.ToTarget()
		j := run(r, id, wantOutput)
		_, sent1 := src.counts()
		return j.Start.Files.Playbooks, sent1 - sent0, r.Proxy.ToTarget() - wire0
	}

	a := newJobRig(t, transfer(t.TempDir()), withApp(func(c *app.Config) { c.Files = src }))

	t.Run("one changed file of 2,000 sends about that file", func(t *testing.T) {
		first, sent1, wire1 := measure(a, "frames-1", "hello world")
		if sent1 < first.Size {
			t.Fatalf("the first job sent %d bytes, want the whole playbooks bundle (%d) and the inventory", sent1, first.Size)
		}
		sayAgain(t, dir, "again")
		second, sent2, wire2 := measure(a, "frames-2", "hello again world")
		if second.Hash == first.Hash {
			t.Fatalf("the changed directory kept its bundle name %s", first.Hash)
		}
		alone := zstdSize(t, []byte(readFile(t, filepath.Join(dir, "hello.yml"))))
		t.Logf("2,000 files, playbooks bundle %d bytes; job 1 sent %d bytes (%d on the wire); after one file changed job 2 sent %d bytes (%d on the wire); the file alone compresses to %d bytes",
			first.Size, sent1, wire1, sent2, wire2, alone)
		// A frame holds 16 entries on average; 1/20 of the bundle is a generous bound for one
		// frame, and far below the whole.
		if sent2 == 0 || sent2 > second.Size/20 {
			t.Fatalf("after one file changed the app sent %d bytes of a %d-byte bundle, want one frame (under %d)", sent2, second.Size, second.Size/20)
		}
		if wire2 > second.Size/10 {
			t.Fatalf("after one file changed %d bytes went to the RTE on the wire, want well under the bundle's %d", wire2, second.Size)
		}
		a.RTE.WaitLog("reused frames of cached bundles", 10*time.Second)
	})

	t.Run("a lying frame index fails the hash and the bundle comes whole", func(t *testing.T) {
		sayAgain(t, dir, "once more")
		// Pack now, to learn the new name and make the source lie about its index.
		pb, err := src.packer.Pack(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		src.swapIndex(pb.Name)
		third, sent, _ := measure(a, "frames-lie", "hello once more again world")
		if third.Hash != pb.Name {
			t.Fatalf("job packed %s, the test expected %s", third.Hash, pb.Name)
		}
		a.RTE.WaitLog("failed its check; asking the app for it whole", 10*time.Second)
		opens, _ := src.counts()
		if opens[pb.Name] != 2 || sent < pb.Size {
			t.Fatalf("bundle opened %d times, %d bytes sent; want twice (ranges, then whole) and at least the whole %d bytes", opens[pb.Name], sent, pb.Size)
		}
	})

	t.Run("an app without the feature sends whole bundles to this RTE", func(t *testing.T) {
		b := newJobRig(t, transfer(t.TempDir()), withApp(func(c *app.Config) { c.Files = src; c.NoBundleFrames = true }))
		first, sent1, _ := measure(b, "whole-1", "hello once more again world")
		sayAgain(t, dir, "whole")
		second, sent2, _ := measure(b, "whole-2", "hello whole once more again world")
		if second.Hash == first.Hash || sent2 != second.Size {
			t.Fatalf("without the feature job 2 sent %d bytes of bundle %s, want exactly the whole %d", sent2, second.Hash, second.Size)
		}
		if sent1 < first.Size {
			t.Fatalf("without the feature job 1 sent %d bytes, want at least the whole %d", sent1, first.Size)
		}
		if strings.Contains(b.RTE.Log(), "reused frames") {
			t.Fatalf("the RTE reused frames with an app that did not offer the feature")
		}
	})
}
