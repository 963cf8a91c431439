package bundle_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/cache/bundle"
)

func newPacker(t *testing.T, opts bundle.PackOptions) *bundle.Packer {
	t.Helper()
	p, err := bundle.NewPacker(filepath.Join(t.TempDir(), "packs"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func packWith(t *testing.T, p *bundle.Packer, dir string) bundle.Packed {
	t.Helper()
	res, err := p.Pack(context.Background(), dir)
	if err != nil {
		t.Fatalf("Packer.Pack(%s): %v", dir, err)
	}
	b, err := os.ReadFile(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if want := "sha256:" + hex.EncodeToString(sum[:]); res.Name != want || res.Size != int64(len(b)) {
		t.Fatalf("Packed %+v, but its file has sha256 %s and %d bytes", res, want, len(b))
	}
	return res
}

// swapContent rewrites a file with different bytes of the same length and puts its mtime
// back, so only reading the file could tell that it changed.
func swapContent(t *testing.T, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strings.Repeat("z", int(fi.Size()))), fi.Mode()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
}

func TestPackerCacheHitDoesNotReadFiles(t *testing.T) {
	root := sampleTree(t)
	p := newPacker(t, bundle.PackOptions{})
	first := packWith(t, p, root)
	direct, name := packBytes(t, root, bundle.PackOptions{})
	if first.Name != name || first.Size != int64(len(direct)) {
		t.Fatalf("Packer gave %s (%d bytes), Pack gave %s (%d bytes); want the same bundle", first.Name, first.Size, name, len(direct))
	}

	// A re-read would now give another name; a cache hit gives the first one.
	swapContent(t, filepath.Join(root, "site.yml"))
	if again := packWith(t, p, root); again != first {
		t.Fatalf("second Pack of a tree with unchanged paths, sizes and mtimes gave %+v, want the cached %+v", again, first)
	}
	// So does a new Packer on the same cache directory (an app restart).
	p2, err := bundle.NewPacker(p.CacheDir, bundle.PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again := packWith(t, p2, root); again != first {
		t.Fatalf("a new Packer on the same cache gave %+v, want the cached %+v", again, first)
	}

	// A changed mtime is a changed tree: it is read again and gets the new content's name.
	old := time.Now().Add(-30 * time.Minute)
	if err := os.Chtimes(filepath.Join(root, "site.yml"), old, old); err != nil {
		t.Fatal(err)
	}
	changed := packWith(t, p, root)
	if _, want := packBytes(t, root, bundle.PackOptions{}); changed.Name != want || changed.Name == first.Name {
		t.Fatalf("Pack after an mtime change gave %s, want a fresh pack %s (not the cached %s)", changed.Name, want, first.Name)
	}
}

func TestPackerDoesNotRememberRacyTrees(t *testing.T) {
	root := t.TempDir()
	p := newPacker(t, bundle.PackOptions{})
	f := filepath.Join(root, "site.yml")
	if err := os.WriteFile(f, []byte("- hosts: all\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	first := packWith(t, p, root)
	// Written within the same clock tick as the pack, a change need not move the mtime.
	swapContent(t, f)
	second := packWith(t, p, root)
	if second.Name == first.Name {
		t.Fatalf("a tree written just before packing was remembered: got the stale %s after its content changed", first.Name)
	}
}

func TestPackerConcurrentPacksAgree(t *testing.T) {
	root := t.TempDir()
	playbookTree(t, root, 200, 1<<20)
	p := newPacker(t, bundle.PackOptions{})
	var wg sync.WaitGroup
	results := make([]bundle.Packed, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = p.Pack(context.Background(), root) })
	}
	wg.Wait()
	for i, r := range results {
		if errs[i] != nil || r != results[0] {
			t.Fatalf("Pack %d gave %+v, %v; want %+v like the first", i, r, errs[i], results[0])
		}
	}
	bundles, _ := filepath.Glob(filepath.Join(p.CacheDir, "*.tar.zst"))
	temps, _ := filepath.Glob(filepath.Join(p.CacheDir, ".pack-*"))
	if len(bundles) != 1 || len(temps) != 0 {
		t.Fatalf("cache holds bundles %v and temporary files %v; want one bundle and no temporary file", bundles, temps)
	}
}

func TestPackerPrune(t *testing.T) {
	p := newPacker(t, bundle.PackOptions{})
	var packed []bundle.Packed
	var dirs []string
	for i := 0; i < 3; i++ {
		root := t.TempDir()
		writeTree(t, root, node{Path: "f", Data: strings.Repeat(string(rune('a'+i)), 1000)})
		r := packWith(t, p, root)
		// Distinct use times, oldest first.
		when := time.Now().Add(time.Duration(i-10) * time.Minute)
		if err := os.Chtimes(r.Path, when, when); err != nil {
			t.Fatal(err)
		}
		packed = append(packed, r)
		dirs = append(dirs, root)
	}
	if err := p.Prune(packed[2].Size + packed[1].Size); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(packed[0].Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the least recently used bundle %s is still there (%v); want it pruned", packed[0].Name, err)
	}
	for _, r := range packed[1:] {
		if _, err := os.Stat(r.Path); err != nil {
			t.Errorf("recently used bundle %s was pruned: %v", r.Name, err)
		}
	}
	if again := packWith(t, p, dirs[0]); again.Name != packed[0].Name {
		t.Errorf("packing a pruned tree again gave %s, want %s", again.Name, packed[0].Name)
	}
}

func TestPackerTooLarge(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, node{Path: "big", Data: strings.Repeat("x", 2048)})
	p := newPacker(t, bundle.PackOptions{MaxBytes: 1024})
	_, err := p.Pack(context.Background(), root)
	var tl *bundle.TooLargeError
	if !errors.As(err, &tl) {
		t.Fatalf("Packer.Pack of 2 KiB with a 1 KiB limit: %v, want a TooLargeError", err)
	}
}

// TestPackerIndexIsKeptUntilPruned: the frame index is read once per bundle and kept; a
// caller's change to what it got does not reach the kept copy; Prune forgets the index of a
// bundle it removes, so a removed bundle has no index.
func TestPackerIndexIsKeptUntilPruned(t *testing.T) {
	p := newPacker(t, bundle.PackOptions{})
	root := t.TempDir()
	writeTree(t, root, node{Path: "f", Data: strings.Repeat("x", 1000)})
	r := packWith(t, p, root)
	first, err := p.Index(r.Name)
	if err != nil || len(first) == 0 {
		t.Fatalf("Index = %v, %v", first, err)
	}
	want := slices.Clone(first)
	first[0].Size = -1
	again, err := p.Index(r.Name)
	if err != nil || !slices.Equal(again, want) {
		t.Fatalf("Index again = %v, %v; want %v (a caller's change reached the kept index)", again, err, want)
	}
	if err := p.Prune(0); err != nil {
		t.Fatal(err)
	}
	if idx, err := p.Index(r.Name); err == nil {
		t.Fatalf("Index of a pruned bundle = %v, want an error", idx)
	}
}
