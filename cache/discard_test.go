package cache_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/protocol"
)

func TestBadBundleIsNamedAndDiscarded(t *testing.T) {
	c := openCache(t, t.TempDir(), "rte-a", 1<<20, nil)
	hostile, hash := hostileBundle(t)
	receive(t, c, hash, hostile, 1<<20)
	ref := protocol.BundleRef{Hash: hash, Size: int64(len(hostile))}

	_, err := c.Prepare(context.Background(), jobStart("site.yml", nil, []protocol.BundleRef{ref}), t.TempDir())
	var bad *cache.BadBundleError
	if !errors.As(err, &bad) || bad.Hash != hash || !strings.Contains(err.Error(), hash) {
		t.Fatalf("Prepare of a hostile bundle: %v, want a *cache.BadBundleError naming %s", err, hash)
	}

	release, err := c.Acquire(hash)
	if err != nil {
		t.Fatal(err)
	}
	if gone, err := c.Discard(hash); err != nil || gone {
		t.Fatalf("Discard of a pinned bundle = %v, %v; want false, nil: a pin keeps it", gone, err)
	}
	if !c.Has(hash) {
		t.Fatal("the pinned bundle was removed")
	}
	release()
	if gone, err := c.Discard(hash); err != nil || !gone {
		t.Fatalf("Discard = %v, %v; want true, nil once unpinned", gone, err)
	}
	if c.Has(hash) {
		t.Fatal("the cache still has the discarded bundle")
	}
	if gone, err := c.Discard(hash); err != nil || !gone {
		t.Fatalf("Discard of an absent bundle = %v, %v; want true, nil", gone, err)
	}
	if _, err := c.Discard("sha256:nope"); err == nil {
		t.Fatal("Discard of a malformed hash: nil error, want one naming it")
	}
}

func TestPrepareCanceledIsNotABadBundle(t *testing.T) {
	c := openCache(t, t.TempDir(), "rte-a", 1<<20, nil)
	refs := stock(t, c, project)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Prepare(ctx, jobStart("site.yml", nil, refs), t.TempDir())
	var bad *cache.BadBundleError
	if err == nil || errors.As(err, &bad) {
		t.Fatalf("Prepare with a canceled context: %v, want an error that is not a *cache.BadBundleError", err)
	}
}

func TestJobsDirIsSweptWithItsRTE(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	sweeper := openCache(t, dir, "rte-a", 1<<20, clk)
	stopped := openCache(t, dir, "rte-stopped", 1<<20, clk)
	if want := filepath.Join(dir, "rtes", "rte-stopped", "jobs"); stopped.JobsDir() != want {
		t.Fatalf("JobsDir() = %s, want %s", stopped.JobsDir(), want)
	}
	job := filepath.Join(stopped.JobsDir(), "1042")
	if err := os.Mkdir(job, 0o700); err != nil {
		t.Fatal(err)
	}
	clk.Advance(cache.DefaultStaleAfter + time.Second)
	if err := sweeper.Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(job); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("job directory of a stopped RTE after the sweep: %v, want it gone", err)
	}
}
