package bundle_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// The two trees every benchmark uses: a realistic playbook repository (2,000 small files across
// roles/, 10 MB) and a large one (4 files, 200 MB of text-ish data).
type benchTree struct {
	name       string
	files      int
	total      int64
	playbookly bool
}

var benchTrees = []benchTree{
	{name: "playbooks-10MB", files: 2000, total: 10 << 20, playbookly: true},
	{name: "large-200MB", files: 4, total: 200 << 20},
}

// benchDirs keeps each tree for the whole run: writing 200 MB of text for every benchmark
// would cost more than the benchmarks. TestMain removes them.
var (
	benchMu   sync.Mutex
	benchDirs = map[string]benchDir{}
)

type benchDir struct {
	dir  string
	size int64
}

func makeBenchTree(b *testing.B, tr benchTree) (dir string, size int64) {
	b.Helper()
	benchMu.Lock()
	defer benchMu.Unlock()
	if d, ok := benchDirs[tr.name]; ok {
		return d.dir, d.size
	}
	dir, err := os.MkdirTemp("", "bench-"+tr.name+"-")
	if err != nil {
		b.Fatal(err)
	}
	if tr.playbookly {
		size = playbookTree(b, dir, tr.files, tr.total)
	} else {
		size = largeTree(b, dir, tr.files, tr.total)
	}
	benchDirs[tr.name] = benchDir{dir, size}
	return dir, size
}

func removeBenchTrees() {
	benchMu.Lock()
	defer benchMu.Unlock()
	for _, d := range benchDirs {
		os.RemoveAll(d.dir)
	}
}

func BenchmarkPack(b *testing.B) {
	for _, tr := range benchTrees {
		b.Run(tr.name, func(b *testing.B) {
			dir, size := makeBenchTree(b, tr)
			b.SetBytes(size)
			var compressed int64
			for b.Loop() {
				_, n, err := bundle.Pack(context.Background(), dir, io.Discard, bundle.PackOptions{})
				if err != nil {
					b.Fatal(err)
				}
				compressed = n
			}
			b.ReportMetric(float64(size)/float64(compressed), "ratio")
		})
	}
}

func BenchmarkUnpack(b *testing.B) {
	for _, tr := range benchTrees {
		b.Run(tr.name, func(b *testing.B) {
			dir, size := makeBenchTree(b, tr)
			data, _ := packBytes(b, dir, bundle.PackOptions{})
			b.SetBytes(size)
			dests := newDests(b)
			for b.Loop() {
				b.StopTimer()
				dest := dests.next()
				b.StartTimer()
				if err := bundle.Unpack(context.Background(), bytes.NewReader(data), dest, bundle.UnpackLimits{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVsTar runs Pack and GNU tar --zstd -c, then Unpack and tar --zstd -x, alternately
// on the same tree and the same bundle bytes, and reports each one's MB/s (of uncompressed file
// bytes). Alternating matters on a shared machine: a burst of load from elsewhere slows both
// sides of one iteration, not one side of the comparison. Skipped without tar and zstd.
func BenchmarkVsTar(b *testing.B) {
	if _, err := exec.LookPath("tar"); err != nil {
		b.Skip("tar is not installed")
	}
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Skip("zstd is not installed (apt-get install zstd)")
	}
	for _, tr := range benchTrees {
		b.Run(tr.name+"/pack", func(b *testing.B) {
			dir, size := makeBenchTree(b, tr)
			out := b.TempDir()
			ours, theirs := &stopwatch{}, &stopwatch{}
			for b.Loop() {
				f, err := os.Create(filepath.Join(out, "ours.tar.zst"))
				if err != nil {
					b.Fatal(err)
				}
				ours.time(func() {
					if _, _, err := bundle.Pack(context.Background(), dir, f, bundle.PackOptions{}); err != nil {
						b.Fatal(err)
					}
				})
				f.Close()
				theirs.time(func() { run(b, "tar", "--zstd", "-cf", filepath.Join(out, "tar.tar.zst"), "-C", dir, ".") })
			}
			ours.report(b, size, "pack")
			theirs.report(b, size, "tar-c")
		})
		b.Run(tr.name+"/unpack", func(b *testing.B) {
			dir, size := makeBenchTree(b, tr)
			data, _ := packBytes(b, dir, bundle.PackOptions{})
			file := filepath.Join(b.TempDir(), "bundle.tar.zst")
			if err := os.WriteFile(file, data, 0o600); err != nil {
				b.Fatal(err)
			}
			dests := newDests(b)
			ours, theirs := &stopwatch{}, &stopwatch{}
			for b.Loop() {
				dest := dests.next()
				ours.time(func() {
					if err := bundle.Unpack(context.Background(), bytes.NewReader(data), dest, bundle.UnpackLimits{}); err != nil {
						b.Fatal(err)
					}
				})
				dest = dests.next()
				theirs.time(func() { run(b, "tar", "--zstd", "-xf", file, "-C", dest) })
			}
			ours.report(b, size, "unpack")
			theirs.report(b, size, "tar-x")
		})
	}
}

// BenchmarkPrepare is the RTE's side end to end for a job whose 10 MB playbook bundle is
// already cached: pin, open, unpack into a fresh job directory, resolve the playbook, unpin.
func BenchmarkPrepare(b *testing.B) {
	tr := benchTrees[0]
	dir, size := makeBenchTree(b, tr)
	data, name := packBytes(b, dir, bundle.PackOptions{})
	c, err := cache.Open(cache.Config{Dir: filepath.Join(b.TempDir(), "cache"), MaxBytes: 1 << 30, Owner: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	in, err := c.Receive(name, int64(len(data)))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := in.WriteAt(data, 0); err != nil {
		b.Fatal(err)
	}
	if err := in.Commit(int64(len(data))); err != nil {
		b.Fatal(err)
	}
	js := &protocol.JobStart{Job: "1042", Playbook: "site.yml",
		Files: &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: name, Size: int64(len(data))}}}
	jobs := newDests(b)
	var releases []func()
	b.SetBytes(size)
	for b.Loop() {
		b.StopTimer()
		jobDir := jobs.next()
		b.StartTimer()
		ws, err := c.Prepare(context.Background(), js, jobDir)
		if err != nil {
			b.Fatal(err)
		}
		releases = append(releases, ws.Release)
	}
	for _, r := range releases {
		r()
	}
}

type stopwatch struct {
	total time.Duration
	n     int
}

func (s *stopwatch) time(f func()) {
	start := time.Now()
	f()
	s.total += time.Since(start)
	s.n++
}

func (s *stopwatch) report(b *testing.B, size int64, what string) {
	perOp := s.total / time.Duration(s.n)
	b.ReportMetric(float64(perOp.Microseconds())/1000, what+"-ms")
	b.ReportMetric(float64(size)/perOp.Seconds()/1e6, what+"-MB/s")
}

// dests hands out a new empty directory for each unpack. They are removed only when the
// benchmark ends: removing thousands of files just before a timed unpack would put the file
// system's deferred work (journal, discard) inside the next measurement.
type dests struct {
	b    *testing.B
	root string
	n    int
}

func newDests(b *testing.B) *dests { return &dests{b: b, root: b.TempDir()} }

func (d *dests) next() string {
	d.n++
	p := filepath.Join(d.root, fmt.Sprint(d.n))
	if err := os.Mkdir(p, 0o700); err != nil {
		d.b.Fatal(err)
	}
	return p
}

func run(b *testing.B, name string, args ...string) {
	b.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// BenchmarkFrames measures what cutting the zstd stream into frames costs and saves, on the
// 2,000-file playbook tree: the compression ratio of the framed bundle against the same tar
// stream compressed as one frame at the same level, and, after one file changes, the bytes an
// RTE holding the old bundle fetches (the new frames, plus the index the app sends, as JSON)
// against the whole new bundle and against that one file compressed alone.
func BenchmarkFrames(b *testing.B) {
	tr := benchTrees[0]
	src, size := makeBenchTree(b, tr)
	dir := filepath.Join(b.TempDir(), "tree")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		b.Fatal(err)
	}
	before, _ := packBytes(b, dir, bundle.PackOptions{})
	oldFrames, err := bundle.ScanFrames(bytes.NewReader(before), 0)
	if err != nil {
		b.Fatal(err)
	}
	changed := filepath.Join(dir, "roles", "role050", "tasks", "file1001.yml")
	body, err := os.ReadFile(changed)
	if err != nil {
		b.Fatal(err)
	}
	body = append(body, "- ansible.builtin.debug: msg=changed\n"...)
	if err := os.WriteFile(changed, body, 0o644); err != nil {
		b.Fatal(err)
	}
	var after []byte
	for b.Loop() {
		after, _ = packBytes(b, dir, bundle.PackOptions{})
	}
	frames, err := bundle.ScanFrames(bytes.NewReader(after), 0)
	if err != nil {
		b.Fatal(err)
	}
	var fetched int64
	for _, f := range frames {
		if !slices.ContainsFunc(oldFrames, func(o bundle.Frame) bool { return o.Hash == f.Hash }) {
			fetched += f.Size
		}
	}
	index := protocol.BundleFrames{Hash: "sha256:" + strings.Repeat("0", 64), Size: int64(len(after))}
	for _, f := range frames {
		index.Frames = append(index.Frames, protocol.BundleFrame{Size: f.Size, SHA256: hex.EncodeToString(f.Hash[:])})
	}
	indexJSON, err := protocol.Encode(&index)
	if err != nil {
		b.Fatal(err)
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(after, nil)
	if err != nil {
		b.Fatal(err)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		b.Fatal(err)
	}
	oneFrame := len(enc.EncodeAll(raw, nil))
	fileAlone := len(enc.EncodeAll(body, nil))
	enc.Close()
	b.ReportMetric(float64(size)/float64(len(after)), "ratio-framed")
	b.ReportMetric(float64(size)/float64(oneFrame), "ratio-one-frame")
	b.ReportMetric(float64(len(frames)), "frames")
	b.ReportMetric(float64(len(after)), "whole-bytes")
	b.ReportMetric(float64(oneFrame), "one-frame-bytes")
	b.ReportMetric(float64(fetched), "changed-frame-bytes")
	b.ReportMetric(float64(len(indexJSON)), "index-bytes")
	b.ReportMetric(float64(fileAlone), "file-alone-bytes")
}
