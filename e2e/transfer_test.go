package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// packSource is the test's app.BundleSource: it packs a copy of e2e/testdata's playbooks and
// inventory with a real bundle.Packer (or another directory per job), serves hostile bundles
// planted by job id, and counts what it sends.
type packSource struct {
	t         testing.TB
	packer    *bundle.Packer
	playbooks string // a copy the test may change
	inventory string

	mu      sync.Mutex
	dirs    map[string]string             // job id -> playbooks directory to pack instead
	planted map[string]*protocol.JobFiles // job id -> bundles to name instead of packing
	raw     map[string][]byte             // planted bundle bytes, by the hash they are served under
	opens   map[string]int                // Open calls by hash
	bytes   int64                         // bytes read through Open, all bundles
	swapped map[string]bool               // bundles whose frame index lies: frames 0 and 1 swapped
}

func newPackSource(t testing.TB) *packSource {
	t.Helper()
	dir := t.TempDir()
	s := &packSource{t: t, playbooks: filepath.Join(dir, "playbooks"), inventory: filepath.Join(dir, "inventory"),
		dirs: map[string]string{}, planted: map[string]*protocol.JobFiles{}, raw: map[string][]byte{}, opens: map[string]int{},
		swapped: map[string]bool{}}
	for _, d := range []string{"playbooks", "inventory"} {
		if err := os.CopyFS(filepath.Join(dir, d), os.DirFS(filepath.Join("testdata", d))); err != nil {
			t.Fatal(err)
		}
	}
	p, err := bundle.NewPacker(filepath.Join(dir, "packed"), bundle.PackOptions{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	s.packer = p
	return s
}

func (s *packSource) Bundles(ctx context.Context, j *app.Job) (*protocol.JobFiles, error) {
	s.mu.Lock()
	planted, dir := s.planted[j.ID], s.dirs[j.ID]
	s.mu.Unlock()
	if planted != nil {
		return planted, nil
	}
	if dir == "" {
		dir = s.playbooks
	}
	pb, err := s.packer.Pack(ctx, dir)
	if err != nil {
		return nil, err
	}
	inv, err := s.packer.Pack(ctx, s.inventory)
	if err != nil {
		return nil, err
	}
	return &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: pb.Name, Size: pb.Size},
		Inventories: []protocol.BundleRef{{Hash: inv.Name, Size: inv.Size}}}, nil
}

func (s *packSource) Open(hash string) (io.ReadCloser, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opens[hash]++
	if b, ok := s.raw[hash]; ok {
		return &counting{r: bytes.NewReader(b), s: s}, int64(len(b)), nil
	}
	f, err := os.Open(filepath.Join(s.packer.CacheDir, strings.TrimPrefix(hash, "sha256:")+".tar.zst"))
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return &counting{r: f, c: f, s: s}, fi.Size(), nil
}

// Index is the packer's frame index (app.BundleIndexer), so the app offers the bundle.frames
// feature; for a bundle marked by swapIndex it lies, with its first two frames swapped.
func (s *packSource) Index(hash string) ([]protocol.BundleFrame, error) {
	s.mu.Lock()
	_, planted := s.raw[hash]
	lie := s.swapped[hash]
	s.mu.Unlock()
	if planted {
		return nil, errors.New("planted bundles have no index")
	}
	frames, err := s.packer.Index(hash)
	if err == nil && lie && len(frames) > 1 {
		frames[0], frames[1] = frames[1], frames[0]
	}
	return frames, err
}

// swapIndex makes Index lie about the bundle hash.
func (s *packSource) swapIndex(hash string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swapped[hash] = true
}

// counting counts the bytes the app reads of a bundle: what it sends.
type counting struct {
	r io.Reader
	c io.Closer
	s *packSource
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.s.mu.Lock()
	c.s.bytes += int64(n)
	c.s.mu.Unlock()
	return n, err
}

// Seek lets the app skip to a range without reading (and counting) what lies before it.
func (c *counting) Seek(off int64, whence int) (int64, error) {
	if sk, ok := c.r.(io.Seeker); ok {
		return sk.Seek(off, whence)
	}
	return 0, errors.New("not seekable")
}

func (c *counting) Close() error {
	if c.c != nil {
		return c.c.Close()
	}
	return nil
}

// plant makes job id name a bundle of bytes b, served under hash with size announced.
func (s *packSource) plant(id, hash string, size int64, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.planted[id] = &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: hash, Size: size}}
	s.raw[hash] = b
}

func (s *packSource) counts() (opens map[string]int, sent int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	opens = map[string]int{}
	for h, n := range s.opens {
		opens[h] = n
	}
	return opens, s.bytes
}

func (s *packSource) useDir(id, dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dirs[id] = dir
}

func hashOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// tarZst writes entries (each a header and, for files, content) as a zstd-compressed tar,
// without the checks bundle.Pack makes: hostile on purpose.
func tarZst(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		if err := tw.WriteHeader(e.hdr); err != nil {
			t.Fatal(err)
		}
		if e.noBody {
			// Only the header: the tar writer would refuse to close without the declared
			// bytes, and the RTE must refuse the entry at its header anyway.
			return zstdOf(t, raw.Bytes())
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return zstdOf(t, raw.Bytes())
}

type tarEntry struct {
	hdr    *tar.Header
	body   string
	noBody bool
}

func zstdOf(t testing.TB, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

const helloPlaybook = "- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug: msg=hi\n"

func fileEntry(name, body string) tarEntry {
	return tarEntry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(body)), Mode: 0o644}, body: body}
}

// zstdWindowBomb is a zstd frame whose header asks for a 1 GiB window: a decoder that
// trusted it would allocate that much before decompressing a byte.
func zstdWindowBomb() []byte {
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 20 << 3} // magic, no flags, window log 10+20
	frame = append(frame, 0x01, 0x10, 0x00)                // last raw block of 512 bytes
	return append(frame, make([]byte, 512)...)
}

// cacheNames lists the paths matching a glob pattern in the cache.
func cacheNames(t testing.TB, pattern string) []string {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func dirBytes(t testing.TB, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

func eventuallyTrue(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	if !testenv.Poll(limit, cond) {
		t.Fatalf("%s: still not so after %s", what, limit)
	}
}

// TestTransfer runs transfer-mode jobs with the real RTE, the real app half and real
// ansible-playbook: bundles packed by a bundle.Packer, asked for by the RTE, sent over the
// socket, checked, cached in an RTE_CACHE_PATH that two RTEs share, unpacked and run.
func TestTransfer(t *testing.T) {
	cacheDir := t.TempDir()
	src := newPackSource(t)
	transfer := func(extra ...string) rigOption {
		return withRTEEnv(append([]string{"RTE_FILES=transfer", "RTE_CACHE_PATH=" + cacheDir, "RTE_CACHE_MB=1",
			// Heartbeats every second; a killed RTE is swept 4s after its last one.
			"RTE_CACHE_STALE_AFTER=4s"}, extra...)...)
	}
	withSource := withApp(func(c *app.Config) { c.Files = src })
	a := newJobRig(t, transfer(), withSource)
	hello := protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"}}
	submit := func(r *jobRig, id string, js protocol.JobStart) *app.Job {
		js.Job = id
		return r.submit(js)
	}
	waitAll := func(r *jobRig, want string, ids ...string) map[string]*app.Job {
		t.Helper()
		out := map[string]*app.Job{}
		for _, id := range ids {
			j := r.waitEnd(id, 2*time.Minute)
			if j.Status != want {
				t.Fatalf("job %s ended %s (%s), want %s", id, j.Status, j.Message, want)
			}
			out[id] = j
		}
		return out
	}

	t.Run("an unchanged directory is sent once, a changed one again", func(t *testing.T) {
		submit(a, "same-1", hello)
		submit(a, "same-2", hello)
		waitAll(a, protocol.StatusSuccess, "same-1", "same-2")
		opens, sent := src.counts()
		first, _ := a.App.GetJob(context.Background(), "same-1")
		second, _ := a.App.GetJob(context.Background(), "same-2")
		files := first.Start.Files
		if files == nil || second.Start.Files == nil || second.Start.Files.Playbooks != files.Playbooks {
			t.Fatalf("files of the two jobs %+v and %+v, want the same bundles", files, second.Start.Files)
		}
		pb, inv := files.Playbooks, files.Inventories[0]
		if opens[pb.Hash] != 1 || opens[inv.Hash] != 1 || sent != pb.Size+inv.Size {
			t.Fatalf("two jobs on one directory: bundles opened %v and %d bytes sent, want each bundle once, %d bytes",
				opens, sent, pb.Size+inv.Size)
		}

		// A changed playbook is a new bundle; the unchanged inventory is not sent again.
		changed := strings.Replace(readFile(t, filepath.Join(src.playbooks, "hello.yml")), "hello {{", "hello again {{", 1)
		if err := os.WriteFile(filepath.Join(src.playbooks, "hello.yml"), []byte(changed), 0o644); err != nil {
			t.Fatal(err)
		}
		submit(a, "same-3", hello)
		waitAll(a, protocol.StatusSuccess, "same-3")
		if out := a.story("same-3").Output; !strings.Contains(out, "hello again world") {
			t.Fatalf("the job after the change did not run the changed playbook:\n%s", out)
		}
		third, _ := a.App.GetJob(context.Background(), "same-3")
		opens, sent2 := src.counts()
		newPB := third.Start.Files.Playbooks
		// At most the whole new bundle: the RTE asks by frames (bundle.frames) and may reuse
		// some of the old bundle's; TestTransferByFrames measures that on a large tree.
		if newPB.Hash == pb.Hash || opens[newPB.Hash] != 1 || opens[inv.Hash] != 1 || sent2-sent > newPB.Size || sent2 == sent {
			t.Fatalf("after the change: bundles opened %v, %d more bytes sent; want only the new playbooks bundle %s (at most %d bytes)",
				opens, sent2-sent, newPB.Hash, newPB.Size)
		}
		t.Logf("sent %d bytes for three jobs: playbooks %d + inventory %d, then the changed playbooks %d", sent2, pb.Size, inv.Size, newPB.Size)
	})

	t.Run("hostile bundles end the job error and leave nothing behind", func(t *testing.T) {
		good := tarZst(t, fileEntry("hello.yml", helloPlaybook))
		hostile := []struct {
			id    string
			hash  string // "" : the bytes' own hash
			size  int64  // 0 : the bytes' length
			bytes []byte
			says  []string
		}{
			{id: "hostile-wrong-hash", hash: hashOf([]byte("something else")), bytes: good,
				says: []string{"discarded", "not to its name"}},
			{id: "hostile-truncated", size: int64(len(good)) + 100, bytes: good,
				says: []string{"discarded", "bundle.end says", "announced"}},
			{id: "hostile-path-escape", bytes: tarZst(t, fileEntry("hello.yml", helloPlaybook), fileEntry("../escape.yml", "x")),
				says: []string{`"../escape.yml"`, `".."`}},
			{id: "hostile-symlink-escape", bytes: tarZst(t, fileEntry("hello.yml", helloPlaybook),
				tarEntry{hdr: &tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "../../../../../etc", Mode: 0o777}}),
				says: []string{`"etc"`, "symlink"}},
			{id: "hostile-hardlink", bytes: tarZst(t, fileEntry("hello.yml", helloPlaybook),
				tarEntry{hdr: &tar.Header{Typeflag: tar.TypeLink, Name: "passwd", Linkname: "/etc/passwd"}}),
				says: []string{`"passwd"`, "hard links"}},
			{id: "hostile-device", bytes: tarZst(t, fileEntry("hello.yml", helloPlaybook),
				tarEntry{hdr: &tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666}}),
				says: []string{`"null"`, "device nodes"}},
			{id: "hostile-tar-bomb", bytes: tarZst(t, fileEntry("hello.yml", helloPlaybook),
				tarEntry{hdr: &tar.Header{Typeflag: tar.TypeReg, Name: "bomb.bin", Size: 3 << 30, Mode: 0o644}, noBody: true}),
				says: []string{"unpack limit MaxBytes", "bomb.bin"}},
			{id: "hostile-zstd-bomb", bytes: zstdWindowBomb(),
				says: []string{"unpack limit MaxDecoderMemory"}},
		}
		for i := range hostile {
			h := &hostile[i]
			if h.hash == "" {
				h.hash = hashOf(h.bytes)
			}
			if h.size == 0 {
				h.size = int64(len(h.bytes))
			}
			src.plant(h.id, h.hash, h.size, h.bytes)
			submit(a, h.id, protocol.JobStart{Playbook: "hello.yml"})
		}
		for _, h := range hostile {
			j := a.waitEnd(h.id, 2*time.Minute)
			if j.Status != protocol.StatusError {
				t.Errorf("job %s ended %s: %s; want error", h.id, j.Status, j.Message)
				continue
			}
			t.Logf("%s: %s", h.id, j.Message)
			for _, want := range append(h.says, h.hash) {
				if !strings.Contains(j.Message, want) {
					t.Errorf("job %s ended with %q, which lacks %q", h.id, j.Message, want)
				}
			}
			if left := cacheNames(t, filepath.Join(cacheDir, "bundles", strings.TrimPrefix(h.hash, "sha256:")+"*")); len(left) != 0 {
				t.Errorf("job %s: the hostile bundle stays in the cache: %v", h.id, left)
			}
			if left := cacheNames(t, filepath.Join(cacheDir, "rtes", "*", "jobs", h.id)); len(left) != 0 {
				t.Errorf("job %s: its job directory stays: %v", h.id, left)
			}
		}
		if left := cacheNames(t, filepath.Join(cacheDir, "rtes", "*", "incoming", "*")); len(left) != 0 {
			t.Errorf("half-received bundles stay in the cache: %v", left)
		}
		// Lock files of bundles no longer in the cache go at the next sweep.
		eventuallyTrue(t, "no lock file of a hostile bundle left", 20*time.Second, func() bool {
			for _, h := range hostile {
				if len(cacheNames(t, filepath.Join(cacheDir, "locks", strings.TrimPrefix(h.hash, "sha256:")+"*"))) > 0 {
					return false
				}
			}
			return true
		})
	})

	t.Run("eviction under a small RTE_CACHE_MB keeps bundles in use", func(t *testing.T) {
		// Five playbook directories of 400 KiB each that do not compress: more than the 1 MiB
		// cache holds together. Four jobs at once, then one more.
		ids := []string{"evict-1", "evict-2", "evict-3", "evict-4", "evict-5"}
		for _, id := range ids {
			dir := filepath.Join(t.TempDir(), id)
			if err := os.CopyFS(dir, os.DirFS(src.playbooks)); err != nil {
				t.Fatal(err)
			}
			blob := make([]byte, 400<<10)
			_, _ = rand.Read(blob)
			if err := os.WriteFile(filepath.Join(dir, "blob.bin"), blob, 0o644); err != nil {
				t.Fatal(err)
			}
			src.useDir(id, dir)
		}
		for _, id := range ids[:4] {
			submit(a, id, hello)
		}
		waitAll(a, protocol.StatusSuccess, ids[:4]...)
		submit(a, ids[4], hello)
		waitAll(a, protocol.StatusSuccess, ids[4])
		// The last commit evicted down to the limit: nothing was pinned but its own bundle.
		if n := dirBytes(t, filepath.Join(cacheDir, "bundles")); n > 1<<20 {
			t.Fatalf("the cache holds %d bytes of bundles after the jobs ended, want at most RTE_CACHE_MB (1 MiB)", n)
		}
		if !strings.Contains(a.RTE.Log(), "evicted bundle") {
			t.Errorf("the RTE never logged an eviction")
		}
	})

	b := newJobRig(t, transfer(), withSource)

	t.Run("two RTEs sharing one cache run jobs on the same bundles at once", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "shared")
		if err := os.CopyFS(dir, os.DirFS(src.playbooks)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "marker.txt"), []byte("shared by two RTEs\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"shared-a1", "shared-a2", "shared-b1", "shared-b2"} {
			src.useDir(id, dir)
		}
		submit(a, "shared-a1", hello)
		submit(b, "shared-b1", hello)
		submit(a, "shared-a2", hello)
		submit(b, "shared-b2", hello)
		waitAll(a, protocol.StatusSuccess, "shared-a1", "shared-a2")
		waitAll(b, protocol.StatusSuccess, "shared-b1", "shared-b2")
		owners := cacheNames(t, filepath.Join(cacheDir, "rtes", "*", "alive"))
		if len(owners) < 2 {
			t.Fatalf("rtes/ holds %v, want a directory for each of the two RTEs", owners)
		}
	})

	t.Run("a killed RTE's job directory is swept by the other", func(t *testing.T) {
		j := submit(b, "killed-mid-job", protocol.JobStart{Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"306"}`)})
		b.waitState(j.ID, app.JobRunning, time.Minute)
		waitPresent(t, "sleep 306")
		jobDirs := cacheNames(t, filepath.Join(cacheDir, "rtes", "*", "jobs", j.ID))
		if len(jobDirs) != 1 {
			t.Fatalf("job directories of %s: %v, want one under the cache's rtes/<owner>/jobs", j.ID, jobDirs)
		}
		owner := filepath.Dir(filepath.Dir(jobDirs[0]))
		b.RTE.Kill()
		// The playbook outlives its RTE (its own process group); the sweep must not wait for it.
		defer killAll(t, "sleep 306", j.ID)
		eventuallyTrue(t, "the killed RTE's directory swept", 30*time.Second, func() bool {
			_, err := os.Stat(owner)
			return errors.Is(err, os.ErrNotExist)
		})
		a.RTE.WaitLog("swept the cache directory of an RTE that stopped", 10*time.Second)
	})
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// killAll kills every process whose command line holds one of markers, until none is left.
func killAll(t testing.TB, markers ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var pids []string
		for _, m := range markers {
			pids = append(pids, processesWith(m)...)
		}
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			var pid int
			if _, err := fmt.Sscan(p, &pid); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("processes with %v still run", markers)
}
