package cache_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/internal/testenv"
)

func TestReceiveCommitAndMissing(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 1<<30, nil)
	data, hash := makeBundle(t, files{"site.yml": "- hosts: all\n"})
	other := "sha256:" + strings.Repeat("ab", 32)
	if got := c.Missing([]string{hash, other, hash}); !slices.Equal(got, []string{hash, other}) {
		t.Fatalf("Missing before receiving = %v, want [%s %s] (in order, once each)", got, hash, other)
	}
	receive(t, c, hash, data, 100)
	if !c.Has(hash) {
		t.Fatalf("Has(%s) = false after Commit", hash)
	}
	if got := c.Missing([]string{hash, other}); !slices.Equal(got, []string{other}) {
		t.Fatalf("Missing after receiving = %v, want only [%s]", got, other)
	}
	if tmp := temps(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left after Commit: %v", tmp)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bundles", strings.TrimPrefix(hash, "sha256:")+".tar.zst"))
	if err != nil || string(b) != string(data) {
		t.Fatalf("cached bundle holds %d bytes (%v), want the %d received", len(b), err, len(data))
	}
}

func TestReceiveOutOfOrderChunks(t *testing.T) {
	c := openCache(t, t.TempDir(), "rte-a", 1<<30, nil)
	data, hash := randomBundle(t, 5000)
	in, err := c.Receive(hash, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	// Second half first, then the first half twice (a resend): the hash must come from the file.
	half := len(data) / 2
	for _, off := range []int{half, 0, 0} {
		end := len(data)
		if off == 0 {
			end = half
		}
		if _, err := in.WriteAt(data[off:end], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Commit(int64(len(data))); err != nil {
		t.Fatalf("Commit of a bundle received out of order: %v", err)
	}
	if !c.Has(hash) {
		t.Fatal("bundle received out of order is not in the cache")
	}
}

func TestReceiveRefusesBadBundles(t *testing.T) {
	data, hash := makeBundle(t, files{"site.yml": "- hosts: all\n"})
	otherData, _ := makeBundle(t, files{"site.yml": "- hosts: web\n"})
	tests := []struct {
		name string
		run  func(c *cache.Cache) error
		want string
	}{
		{"wrong hash", func(c *cache.Cache) error {
			return receiveErr(c, hash, append(otherData, make([]byte, len(data)-len(otherData))...)[:len(data)], 64)
		}, "hash to sha256:"},
		{"truncated", func(c *cache.Cache) error {
			in, err := c.Receive(hash, int64(len(data)))
			if err != nil {
				return err
			}
			if _, err := in.WriteAt(data[:len(data)-10], 0); err != nil {
				return err
			}
			return in.Commit(int64(len(data)))
		}, "truncated"},
		{"size differs at the end", func(c *cache.Cache) error {
			in, err := c.Receive(hash, int64(len(data)))
			if err != nil {
				return err
			}
			in.WriteAt(data, 0)
			return in.Commit(int64(len(data)) + 1)
		}, "were announced"},
		{"chunk past the size", func(c *cache.Cache) error {
			in, err := c.Receive(hash, int64(len(data)))
			if err != nil {
				return err
			}
			defer in.Abort()
			_, err = in.WriteAt(data, 1)
			return err
		}, "goes past its announced size"},
		{"larger than the cache", func(c *cache.Cache) error {
			_, err := c.Receive(hash, 2<<30)
			return err
		}, "RTE_CACHE_MB"},
		{"bad name", func(c *cache.Cache) error {
			_, err := c.Receive("md5:abc", 10)
			return err
		}, "not sha256:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := openCache(t, dir, "rte-a", 1<<30, nil)
			err := tc.run(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got error %v, want one saying %q", err, tc.want)
			}
			if tc.name != "bad name" && !strings.Contains(err.Error(), hash) && tc.name != "chunk past the size" && tc.name != "larger than the cache" {
				t.Errorf("error %q does not name the bundle %s", err, hash)
			}
			if c.Has(hash) {
				t.Error("the refused bundle is in the cache")
			}
			if got := dirNames(t, filepath.Join(dir, "bundles")); len(got) != 0 {
				t.Errorf("bundles/ holds %v after a refusal; want nothing", got)
			}
			if tmp := temps(t, dir); len(tmp) != 0 {
				t.Errorf("temporary files left after a refusal: %v", tmp)
			}
		})
	}
}

func TestTwoRTEsReceiveOneBundleAtOnce(t *testing.T) {
	dir := t.TempDir()
	a := openCache(t, dir, "rte-a", 1<<30, nil)
	b := openCache(t, dir, "rte-b", 1<<30, nil)
	data, hash := randomBundle(t, 300_000)
	for round := 0; round < 5; round++ {
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i, c := range []*cache.Cache{a, b, a, b} {
			wg.Go(func() {
				<-start
				errs[i] = receiveErr(c, hash, data, 4096)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: receiver %d: %v; want every receiver to succeed", round, i, err)
			}
		}
		if got := dirNames(t, filepath.Join(dir, "bundles")); len(got) != 1 {
			t.Fatalf("round %d: bundles/ holds %v, want exactly one file", round, got)
		}
		if tmp := temps(t, dir); len(tmp) != 0 {
			t.Fatalf("round %d: temporary files left: %v", round, tmp)
		}
	}
	// A later commit of the same bundle keeps the file (and so every pin on it).
	p := filepath.Join(dir, "bundles", strings.TrimPrefix(hash, "sha256:")+".tar.zst")
	before := inode(t, p)
	receive(t, b, hash, data, 1<<20)
	if after := inode(t, p); after != before {
		t.Fatalf("a second commit replaced the bundle file (inode %d, now %d); want a no-op", before, after)
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestEvictLeastRecentlyUsed(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	d1, h1 := randomBundle(t, 20_000)
	d2, h2 := randomBundle(t, 20_000)
	d3, h3 := randomBundle(t, 20_000)
	// Room for any two of the three, not all three. Random bundles differ in size by a few
	// bytes, so the room is two of the largest: sized as d1+d3, a larger d2 evicted h1 already
	// at the second commit (1 run in 30).
	room := 2 * max(len(d1), len(d2), len(d3))
	if room >= len(d1)+len(d2)+len(d3) {
		t.Fatalf("bundles of %d, %d and %d bytes: too unequal for a cache with room for two", len(d1), len(d2), len(d3))
	}
	c := openCache(t, dir, "rte-a", int64(room), clk)
	receive(t, c, h1, d1, 4096)
	clk.Advance(time.Minute)
	receive(t, c, h2, d2, 4096)
	clk.Advance(time.Minute)
	release, err := c.Acquire(h1) // a use: h1 is now more recent than h2
	if err != nil {
		t.Fatal(err)
	}
	release()
	clk.Advance(time.Minute)
	receive(t, c, h3, d3, 4096)
	if !c.Has(h1) || c.Has(h2) || !c.Has(h3) {
		t.Fatalf("after the third bundle: has h1=%v h2=%v h3=%v; want h2, the least recently used, evicted", c.Has(h1), c.Has(h2), c.Has(h3))
	}
	// The numbers behind the cache's metrics: what is there, what jobs found, what went.
	if missing := c.Missing([]string{h1, h2, h3, h1}); len(missing) != 1 || missing[0] != h2 {
		t.Fatalf("Missing = %v, want only h2", missing)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := cache.Stats{Bytes: int64(len(d1) + len(d3)), Bundles: 2, Hits: 2, Misses: 1, Evictions: 1}
	if st != want {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
}

// pinnerEnv makes the test binary a second RTE process: it opens the cache directory, pins a
// bundle, says "pinned", and holds the pin until its stdin closes.
const pinnerEnv = "RTE_CACHE_TEST_PINNER"

func pinnerMain() {
	dir, hash, _ := strings.Cut(os.Getenv(pinnerEnv), "|")
	c, err := cache.Open(cache.Config{Dir: dir, MaxBytes: 1 << 30, Owner: "pinner", Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	release, err := c.Acquire(hash)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("pinned")
	io.Copy(io.Discard, os.Stdin)
	release()
	os.Exit(0)
}

// startPinner runs a second RTE process holding a pin on hash; the returned func ends it.
func startPinner(t *testing.T, dir, hash string) (stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pinnerEnv+"="+dir+"|"+hash)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "pinned\n" {
		stdin.Close()
		cmd.Wait()
		t.Fatalf("pinner process said %q, %v; want \"pinned\"", line, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("pinner process: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func TestEvictSkipsBundlesPinnedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	d1, h1 := randomBundle(t, 20_000)
	d2, h2 := randomBundle(t, 20_000)
	d3, h3 := randomBundle(t, 20_000)
	d4, h4 := randomBundle(t, 20_000)
	c := openCache(t, dir, "rte-a", int64(2*max(len(d1), len(d2), len(d3), len(d4))), clk)
	receive(t, c, h1, d1, 4096) // the least recently used from here on
	clk.Advance(time.Minute)
	receive(t, c, h2, d2, 4096)
	stop := startPinner(t, dir, h1)
	clk.Advance(time.Minute)
	receive(t, c, h3, d3, 4096)
	// Over the limit: h1 is the least recently used but pinned by the other process, so h2 goes.
	if !c.Has(h1) || c.Has(h2) || !c.Has(h3) {
		t.Fatalf("with h1 pinned by another RTE: has h1=%v h2=%v h3=%v; want h1 kept, h2 evicted, h3 kept", c.Has(h1), c.Has(h2), c.Has(h3))
	}
	stop()
	clk.Advance(time.Minute)
	receive(t, c, h4, d4, 4096)
	if c.Has(h1) || !c.Has(h3) || !c.Has(h4) {
		t.Fatalf("after the pin was released: has h1=%v h3=%v h4=%v; want h1 evicted, h3 and h4 kept", c.Has(h1), c.Has(h3), c.Has(h4))
	}
}

func TestPinBeforeReceiveProtectsTheBundle(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	dq, hq := randomBundle(t, 20_000)
	dr, hr := randomBundle(t, 20_000)
	a := openCache(t, dir, "rte-a", int64(max(len(dq), len(dr))), clk)
	b := openCache(t, dir, "rte-b", int64(max(len(dq), len(dr))), clk)
	release, err := a.Acquire(hq) // a job on RTE a needs q, which is not here yet
	if err != nil {
		t.Fatal(err)
	}
	receive(t, b, hq, dq, 4096)
	clk.Advance(time.Minute)
	receive(t, b, hr, dr, 4096) // over the limit: q is older, but pinned
	if !a.Has(hq) || !a.Has(hr) {
		t.Fatalf("has q=%v r=%v; want both: q pinned before it arrived, r just committed", a.Has(hq), a.Has(hr))
	}
	release()
	if err := b.Evict(); err != nil {
		t.Fatal(err)
	}
	if a.Has(hq) || !a.Has(hr) {
		t.Fatalf("after release and Evict: has q=%v r=%v; want q evicted", a.Has(hq), a.Has(hr))
	}
}

func TestSweepRemovesStoppedRTEsOnly(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	a := openCache(t, dir, "rte-a", 1<<30, clk)
	stopped := openCache(t, dir, "rte-stopped", 1<<30, clk)
	jobDir, _, err := stopped.JobDir("1042")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(jobDir, "left.yml"), []byte("x"), 0o400); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5 * time.Minute)
	live := openCache(t, dir, "rte-live", 1<<30, clk)
	clk.Advance(5*time.Minute + time.Second) // stopped: 10m1s idle; live: 5m1s
	if err := a.Sweep(); err != nil {
		t.Fatal(err)
	}
	got := dirNames(t, filepath.Join(dir, "rtes"))
	if !slices.Equal(got, []string{"rte-a", "rte-live"}) {
		t.Fatalf("rtes/ after the sweep = %v, want [rte-a rte-live]: only the RTE idle past StaleAfter swept", got)
	}
	clk.Advance(6 * time.Minute)
	if err := live.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if err := a.Sweep(); err != nil {
		t.Fatal(err)
	}
	// rte-a never swept itself, although it did not heartbeat either.
	if got := dirNames(t, filepath.Join(dir, "rtes")); !slices.Equal(got, []string{"rte-a", "rte-live"}) {
		t.Fatalf("rtes/ = %v, want [rte-a rte-live]: a heartbeating RTE is never swept, nor the sweeper itself", got)
	}
	// A swept RTE that wakes up makes its directory again.
	if err := stopped.Heartbeat(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := stopped.JobDir("1043"); err != nil {
		t.Fatalf("JobDir after the RTE's directory was swept: %v", err)
	}
}

func TestSweepDropsUnusedLockFiles(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 1<<30, nil)
	never := "sha256:" + strings.Repeat("0f", 32)
	held := "sha256:" + strings.Repeat("1e", 32)
	release, err := c.Acquire(never)
	if err != nil {
		t.Fatal(err)
	}
	release()
	hold, err := c.Acquire(held)
	if err != nil {
		t.Fatal(err)
	}
	defer hold()
	if err := c.Sweep(); err != nil {
		t.Fatal(err)
	}
	got := dirNames(t, filepath.Join(dir, "locks"))
	if want := []string{strings.Repeat("1e", 32) + ".lock"}; !slices.Equal(got, want) {
		t.Fatalf("locks/ after the sweep = %v, want %v: the unused lock dropped, the held one kept", got, want)
	}
}

func TestJobDir(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 1<<30, nil)
	jd, cleanup, err := c.JobDir("1042")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "rtes", "rte-a", "jobs", "1042"); jd != want {
		t.Fatalf("JobDir = %s, want %s", jd, want)
	}
	fi, err := os.Stat(jd)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("job directory mode %v (%v), want 0700", fi.Mode(), err)
	}
	if _, _, err := c.JobDir("1042"); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("second JobDir for one job: %v, want 'already exists'", err)
	}
	if _, _, err := c.JobDir("../x"); err == nil {
		t.Fatal("JobDir(\"../x\") succeeded; want a refusal")
	}
	ro := filepath.Join(jd, "ro")
	if err := os.MkdirAll(filepath.Join(ro, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(ro, "sub", "f"), []byte("x"), 0o400)
	os.Chmod(filepath.Join(ro, "sub"), 0o500)
	os.Chmod(ro, 0o500)
	cleanup()
	cleanup()
	if _, err := os.Stat(jd); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("job directory still there after cleanup: %v", err)
	}
}

func TestRunHeartbeatsAndSweeps(t *testing.T) {
	dir := t.TempDir()
	c, err := cache.Open(cache.Config{Dir: dir, MaxBytes: 1 << 30, Owner: "rte-a", StaleAfter: 200 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(dir, "rtes", "rte-gone")
	if err := os.MkdirAll(filepath.Join(gone, "jobs"), 0o700); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	os.Chtimes(gone, past, past)
	alive := filepath.Join(dir, "rtes", "rte-a", "alive")
	os.Chtimes(alive, past, past)

	ctx, cancel := contextWithCancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var (
		fi      os.FileInfo
		goneErr error
	)
	if !testenv.Poll(10*time.Second, func() bool {
		fi, err = os.Stat(alive)
		_, goneErr = os.Stat(gone)
		return err == nil && fi.ModTime().After(past) && errors.Is(goneErr, os.ErrNotExist)
	}) {
		cancel()
		<-done
		t.Fatalf("after 10s of Run: heartbeat %v (%v), stale directory %v; want a fresh heartbeat and the stale RTE swept", fi.ModTime(), err, goneErr)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
}

func TestOpenReportsEveryProblem(t *testing.T) {
	_, err := cache.Open(cache.Config{Owner: "a/b", MaxBytes: -1})
	if err == nil {
		t.Fatal("Open with no Dir, a negative MaxBytes and a bad Owner succeeded")
	}
	for _, want := range []string{"RTE_CACHE_PATH", "RTE_CACHE_MB", "Owner"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error %q does not mention %s", err, want)
		}
	}
}

func TestNewOwner(t *testing.T) {
	a, b := cache.NewOwner("pod-0.rte.svc/x y"), cache.NewOwner("pod-0.rte.svc/x y")
	if a == b || !strings.HasPrefix(a, "pod-0.rte.svc-x-y-") {
		t.Fatalf("NewOwner gave %q and %q; want a sanitised hostname and distinct nonces", a, b)
	}
	if _, err := cache.Open(cache.Config{Dir: t.TempDir(), MaxBytes: 1, Owner: a}); err != nil {
		t.Fatalf("Open rejects NewOwner's %q: %v", a, err)
	}
	if o := cache.NewOwner(""); !strings.HasPrefix(o, "rte-") {
		t.Fatalf("NewOwner(\"\") = %q, want an rte- prefix", o)
	}
}
