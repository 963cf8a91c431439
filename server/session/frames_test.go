package session_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

var framesWelcome = protocol.Welcome{Protocol: protocol.Version, Node: "app-1", Approved: true,
	Features: []string{protocol.FeatureBundleFrames}}

// framedBlob packs a tree of n files, the one named changed holding extra, into a real
// framed bundle, and returns it with its frame index.
func framedBlob(t *testing.T, n int, changed, extra string) (blob, []protocol.BundleFrame) {
	t.Helper()
	root := t.TempDir()
	for i := range n {
		p := filepath.Join(root, fmt.Sprintf("d%02d", i/20), fmt.Sprintf("f%04d.yml", i))
		body := strings.Repeat(fmt.Sprintf("- line %d of a task file\n", i), 30+i%17)
		if filepath.Base(p) == changed {
			body += extra
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	name, size, err := bundle.Pack(context.Background(), root, &buf, bundle.PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	frames, err := bundle.ScanFrames(bytes.NewReader(buf.Bytes()), 0)
	if err != nil {
		t.Fatal(err)
	}
	index := make([]protocol.BundleFrame, len(frames))
	for i, f := range frames {
		index[i] = protocol.BundleFrame{Size: f.Size, SHA256: hex.EncodeToString(f.Hash[:])}
	}
	return blob{data: buf.Bytes(), raw: sha256.Sum256(buf.Bytes()), ref: protocol.BundleRef{Hash: name, Size: size}}, index
}

// sendRanges sends the ranges of b the RTE asked for, then bundle.end, and returns how many
// bytes it sent.
func (a *app) sendRanges(b blob, rs []protocol.ByteRange) int64 {
	a.t.Helper()
	var n int64
	for _, r := range rs {
		a.sendBundle(b, int(r.Offset), int(r.Offset+r.Size), 64<<10, false)
		n += r.Size
	}
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	return n
}

// TestFetchByFrames: with an app that names bundle.frames, the RTE asks for a bundle's index,
// copies the frames its cache holds and asks only for the rest; a lying index fails the hash
// and the bundle is asked for once more, whole; messages out of turn are bad messages.
func TestFetchByFrames(t *testing.T) {
	r := newBundleRig(t)
	a := r.dial(t)
	a.handshake(framesWelcome)

	first, firstIndex := framedBlob(t, 300, "", "")
	done := fetch(r.m, context.Background(), "j1", first.ref)
	w := expect[*protocol.BundleWant](a)
	if !slices.Equal(w.Frames, []string{first.ref.Hash}) {
		t.Fatalf("bundle.want frames = %v, want the bundle's index asked for", w.Frames)
	}
	a.send(&protocol.BundleFrames{Hash: first.ref.Hash, Size: first.ref.Size, Frames: firstIndex})
	rs := expect[*protocol.BundleRanges](a)
	if len(rs.Ranges) != 1 || rs.Ranges[0] != (protocol.ByteRange{Offset: 0, Size: first.ref.Size}) || rs.Job != "j1" {
		t.Fatalf("with an empty cache the RTE asked for %+v, want the whole bundle in one range", rs)
	}
	a.sendRanges(first, rs.Ranges)
	if err := <-done; err != nil {
		t.Fatalf("Fetch of the first bundle: %v", err)
	}

	second, secondIndex := framedBlob(t, 300, "f0123.yml", "- one more line\n")
	done = fetch(r.m, context.Background(), "j2", second.ref)
	expect[*protocol.BundleWant](a)
	a.send(&protocol.BundleFrames{Hash: second.ref.Hash, Size: second.ref.Size, Frames: secondIndex})
	rs = expect[*protocol.BundleRanges](a)
	sent := a.sendRanges(second, rs.Ranges)
	if err := <-done; err != nil {
		t.Fatalf("Fetch of the changed bundle: %v", err)
	}
	if sent == 0 || sent > second.ref.Size/10 {
		t.Fatalf("one changed file: the RTE asked for %d of %d bytes (%+v), want one frame", sent, second.ref.Size, rs.Ranges)
	}
	if got := metric(t, r.reg, "rte_bundle_reused_bytes_total", nil); got != float64(second.ref.Size-sent) {
		t.Errorf("rte_bundle_reused_bytes_total = %v, want the %d bytes not sent", got, second.ref.Size-sent)
	}

	// The index lies (two frames swapped): the whole hash fails, and the RTE asks again,
	// this time for the bundle whole, without frames.
	third, thirdIndex := framedBlob(t, 300, "f0200.yml", "- another line\n")
	lie := slices.Clone(thirdIndex)
	lie[0], lie[1] = lie[1], lie[0]
	done = fetch(r.m, context.Background(), "j3", third.ref)
	expect[*protocol.BundleWant](a)
	a.send(&protocol.BundleFrames{Hash: third.ref.Hash, Size: third.ref.Size, Frames: lie})
	a.sendRanges(third, expect[*protocol.BundleRanges](a).Ranges)
	w = expect[*protocol.BundleWant](a)
	if !slices.Equal(w.Hashes, []string{third.ref.Hash}) || len(w.Frames) != 0 {
		t.Fatalf("after a failed delta the RTE asked %+v, want the bundle again without frames", w)
	}
	a.sendBundle(third, 0, len(third.data), 64<<10, false)
	a.send(&protocol.BundleEnd{Hash: third.ref.Hash, Size: third.ref.Size})
	if err := <-done; err != nil {
		t.Fatalf("Fetch after the whole bundle came: %v", err)
	}

	// Out of turn: an index nobody asked for, and one of another size than announced.
	a.send(&protocol.BundleFrames{Hash: first.ref.Hash, Size: first.ref.Size, Frames: firstIndex})
	if e := expect[*protocol.Error](a); e.Code != protocol.ErrUnexpected || e.Ref != first.ref.Hash {
		t.Fatalf("answer to an unasked bundle.frames: %+v, want unexpected", *e)
	}
	fourth, fourthIndex := framedBlob(t, 50, "f0001.yml", "- x\n")
	done = fetch(r.m, context.Background(), "j4", fourth.ref)
	expect[*protocol.BundleWant](a)
	grown := append(slices.Clone(fourthIndex), protocol.BundleFrame{Size: 10, SHA256: strings.Repeat("0", 64)})
	a.send(&protocol.BundleFrames{Hash: fourth.ref.Hash, Size: fourth.ref.Size + 10, Frames: grown})
	if err := <-done; err == nil || !strings.Contains(err.Error(), "bundle.frames says") || !strings.Contains(err.Error(), fourth.ref.Hash) {
		t.Fatalf("Fetch after bundle.frames of the wrong size: %v, want an error naming the sizes and the bundle", err)
	}
	a.probe()
	if l := r.leftovers(t); len(l) != 0 {
		t.Errorf("incoming holds %v, want nothing", l)
	}
}

// TestFetchWithoutFeatureAsksWhole: an app whose welcome does not name bundle.frames never
// sees frames in bundle.want.
func TestFetchWithoutFeatureAsksWhole(t *testing.T) {
	r := newBundleRig(t)
	a := r.dial(t)
	a.handshake(approved)
	b, _ := framedBlob(t, 50, "", "")
	done := fetch(r.m, context.Background(), "j1", b.ref)
	if w := expect[*protocol.BundleWant](a); len(w.Frames) != 0 {
		t.Fatalf("bundle.want to an app without the feature names frames %v", w.Frames)
	}
	a.sendBundle(b, 0, len(b.data), 64<<10, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFetchByFramesAfterTheJobStopsWaiting: a job that stops waiting between bundle.want and
// bundle.frames does not stop the transfer: the RTE still asks for the ranges, naming that
// job, and keeps the bundle for the next job.
func TestFetchByFramesAfterTheJobStopsWaiting(t *testing.T) {
	r := newBundleRig(t)
	a := r.dial(t)
	a.handshake(framesWelcome)
	b, index := framedBlob(t, 100, "", "")
	ctx, cancel := context.WithCancel(context.Background())
	done := fetch(r.m, ctx, "gone", b.ref)
	expect[*protocol.BundleWant](a)
	cancel()
	if err := <-done; err == nil {
		t.Fatal("Fetch after its context ended: nil, want an error")
	}
	a.send(&protocol.BundleFrames{Hash: b.ref.Hash, Size: b.ref.Size, Frames: index})
	rs := expect[*protocol.BundleRanges](a)
	if rs.Job != "gone" {
		t.Fatalf("bundle.ranges names job %q, want the job of the bundle.want", rs.Job)
	}
	a.sendRanges(b, rs.Ranges)
	a.probe() // the end was taken before the probe's answer
	if !r.c.Has(b.ref.Hash) {
		t.Fatalf("the bundle no job waits for any more was not kept")
	}
}
