package cache_test

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// manyFiles is a tree of n text files, big enough to be cut into many frames.
func manyFiles(n int) files {
	tree := files{}
	for i := range n {
		tree[fmt.Sprintf("roles/r%02d/tasks/f%04d.yml", i/20, i)] = strings.Repeat(fmt.Sprintf("- debug: msg=%d line\n", i), 40+i%13)
	}
	return tree
}

func indexOf(t testing.TB, data []byte) []protocol.BundleFrame {
	t.Helper()
	frames, err := bundle.ScanFrames(bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]protocol.BundleFrame, len(frames))
	for i, f := range frames {
		out[i] = protocol.BundleFrame{Size: f.Size, SHA256: hex.EncodeToString(f.Hash[:])}
	}
	return out
}

// fillAndFinish fills a new bundle from the cache, writes only the missing ranges from data,
// and commits; it returns the ranges that were missing.
func fillAndFinish(t testing.TB, c *cache.Cache, name string, data []byte, index []protocol.BundleFrame) ([]protocol.ByteRange, int64, error) {
	t.Helper()
	in, err := c.Receive(name, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	missing, filled, err := in.Fill(index)
	if err != nil {
		in.Abort()
		return nil, 0, err
	}
	for _, r := range missing {
		if _, err := in.WriteAt(data[r.Offset:r.Offset+r.Size], r.Offset); err != nil {
			t.Fatal(err)
		}
	}
	return missing, filled, in.Commit(int64(len(data)))
}

// cachedTree opens a cache in a new directory and commits into it the bundle of a 400-file
// tree, which the test then changes.
func cachedTree(t testing.TB) (string, *cache.Cache, files, string, []byte) {
	t.Helper()
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 64<<20, nil)
	tree := manyFiles(400)
	data, name := makeBundle(t, tree)
	receive(t, c, name, data, 64<<10)
	return dir, c, tree, name, data
}

func rangeBytes(rs []protocol.ByteRange) int64 {
	var n int64
	for _, r := range rs {
		n += r.Size
	}
	return n
}

// TestFillReusesFramesOfCachedBundles: a bundle that differs from a cached one by one file
// needs only the frame holding that file; the rest is copied from the cache and the whole
// still hashes to its name.
func TestFillReusesFramesOfCachedBundles(t *testing.T) {
	dir, c, tree, oldName, _ := cachedTree(t)
	if _, err := os.Stat(filepath.Join(dir, "frames", strings.TrimPrefix(oldName, "sha256:")+".frames")); err != nil {
		t.Fatalf("no frame index beside the committed bundle: %v", err)
	}

	tree["roles/r07/tasks/f0150.yml"] += "- debug: msg=changed\n"
	newData, newName := makeBundle(t, tree)
	index := indexOf(t, newData)
	missing, filled, err := fillAndFinish(t, c, newName, newData, index)
	if err != nil {
		t.Fatalf("a bundle filled from cached frames failed its commit: %v", err)
	}
	if len(missing) != 1 || filled+rangeBytes(missing) != int64(len(newData)) || rangeBytes(missing) > int64(len(newData))/10 {
		t.Fatalf("one changed file of 400: missing %v (%d bytes), filled %d of %d; want one small range", missing, rangeBytes(missing), filled, len(newData))
	}
	if !c.Has(newName) {
		t.Fatalf("the filled bundle is not in the cache")
	}
	t.Logf("%d frames, %d bytes reused, %d of %d bytes to fetch", len(index), filled, rangeBytes(missing), len(newData))

	// Frames that do not add up to the announced size are refused before anything is written.
	in, err := c.Receive(newName, int64(len(newData)))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Abort()
	if _, _, err := in.Fill(index[1:]); err == nil || !strings.Contains(err.Error(), "add up to") {
		t.Errorf("Fill with a frame short: %v, want a refusal saying the frames do not add up", err)
	}
}

// TestFillFailsClosed: a cached frame whose bytes changed on disk, and an index that lies,
// cost a transfer, never a wrong bundle. A frame that does not hash to the app's index is
// asked for; a bundle put together from frames in the wrong place fails its commit.
func TestFillFailsClosed(t *testing.T) {
	dir, c, tree, oldName, _ := cachedTree(t)
	tree["roles/r00/tasks/f0001.yml"] += "- debug: msg=changed\n"
	newData, newName := makeBundle(t, tree)
	index := indexOf(t, newData)
	last := index[len(index)-1]

	// Flip a byte of the cached bundle inside its last frame, which the new bundle shares.
	p := filepath.Join(dir, "bundles", strings.TrimPrefix(oldName, "sha256:")+".tar.zst")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-2] ^= 0xff
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	missing, _, err := fillAndFinish(t, c, newName, newData, index)
	if err != nil {
		t.Fatalf("commit after a corrupt cached frame was asked for again: %v", err)
	}
	end := missing[len(missing)-1]
	if end.Offset+end.Size != int64(len(newData)) || end.Size < last.Size {
		t.Fatalf("missing %v: the corrupt cached frame (the last %d bytes) was not asked for", missing, last.Size)
	}

	// An index with two frames swapped: each is in the cache and hashes right, but in the
	// wrong place, so the bundle does not hash to its name and Commit refuses it.
	tree["roles/r01/tasks/f0030.yml"] += "- debug: msg=changed again\n"
	thirdData, thirdName := makeBundle(t, tree)
	lie := indexOf(t, thirdData)
	lie[0], lie[1] = lie[1], lie[0]
	_, filled, err := fillAndFinish(t, c, thirdName, thirdData, lie)
	if filled == 0 {
		t.Fatalf("the swapped frames were not found in the cache; the test proves nothing")
	}
	if err == nil || !strings.Contains(err.Error(), "not to its name") {
		t.Fatalf("commit of a bundle filled by a lying index: %v, want the hash check to refuse it", err)
	}
	if c.Has(thirdName) {
		t.Fatalf("a bundle that failed its hash is in the cache")
	}
}

// TestEvictRemovesFrameIndex: an evicted bundle takes its frame index with it, and a sweep
// removes an index whose bundle is gone.
func TestEvictRemovesFrameIndex(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 64<<20, nil)
	data, name := makeBundle(t, manyFiles(200))
	receive(t, c, name, data, 1<<20)
	if n := dirNames(t, filepath.Join(dir, "frames")); len(n) != 1 {
		t.Fatalf("frames/ holds %v, want the index of the one bundle", n)
	}
	if gone, err := c.Discard(name); !gone || err != nil {
		t.Fatalf("Discard: %v, %v", gone, err)
	}
	if n := dirNames(t, filepath.Join(dir, "frames")); len(n) != 0 {
		t.Fatalf("frames/ holds %v after the bundle was removed, want nothing", n)
	}

	// An index left without its bundle (a process killed between the two removals) goes at
	// the next sweep; the index of a bundle still cached stays.
	receive(t, c, name, data, 1<<20)
	orphan := filepath.Join(dir, "frames", strings.Repeat("ab", 32)+".frames")
	if err := os.WriteFile(orphan, []byte("0 10 "+strings.Repeat("0", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Sweep(); err != nil {
		t.Fatal(err)
	}
	if n := dirNames(t, filepath.Join(dir, "frames")); len(n) != 1 || n[0] != strings.TrimPrefix(name, "sha256:")+".frames" {
		t.Fatalf("frames/ holds %v after a sweep, want only the index of the cached bundle", n)
	}
}
