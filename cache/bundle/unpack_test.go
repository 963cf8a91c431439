package bundle_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache/bundle"
)

// sandbox is a directory holding an empty dest and a sentinel beside it, so a test can see
// that nothing was written outside dest.
type sandbox struct{ base, dest string }

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	base := t.TempDir()
	s := sandbox{base: base, dest: filepath.Join(base, "dest")}
	writeTree(t, base, node{Path: "dest", Dir: true, Mode: 0o700}, node{Path: "outside/sentinel", Data: "untouched"})
	return s
}

// check fails the test if anything besides dest and the sentinel exists, if the sentinel
// changed, or if a symlink in dest resolves outside it.
func (s sandbox) check(t testing.TB) {
	t.Helper()
	top, err := os.ReadDir(s.base)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range top {
		if e.Name() != "dest" && e.Name() != "outside" {
			t.Fatalf("%s appeared beside dest", e.Name())
		}
	}
	out, err := os.ReadDir(filepath.Join(s.base, "outside"))
	if err != nil || len(out) != 1 {
		t.Fatalf("outside/ holds %v (%v), want only the sentinel", out, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.base, "outside/sentinel")); err != nil || string(b) != "untouched" {
		t.Fatalf("sentinel is %q (%v), want it untouched", b, err)
	}
	realDest, err := filepath.EvalSymlinks(s.dest)
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.Walk(s.dest, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return nil
		}
		resolved, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil // dangling or a loop: it leads nowhere, so nowhere outside
		}
		if resolved != realDest && !strings.HasPrefix(resolved, realDest+"/") {
			t.Fatalf("symlink %s resolves to %s, outside %s", p, resolved, realDest)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (s sandbox) empty(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir(s.dest)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("dest still holds %d entries (first %q) after a refused bundle; want it empty", len(ents), ents[0].Name())
	}
}

// zeroBomb declares one file of size bytes and follows the header with zstd frames of zeros
// that really decompress to that many bytes, while the bundle itself stays small.
func zeroBomb(t testing.TB, files int, size int64) []byte {
	t.Helper()
	zeros := compress(t, make([]byte, 1<<20))
	var out []byte
	for i := 0; i < files; i++ {
		var hdr bytes.Buffer
		tw := tar.NewWriter(&hdr)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros" + string(rune('a'+i)), Size: size, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		// tw is not closed: the header is all that is wanted from it.
		out = append(out, compress(t, hdr.Bytes())...)
		for n := int64(0); n < size; n += 1 << 20 {
			out = append(out, zeros...)
		}
	}
	return out
}

func wideWindow(t testing.TB) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	data := text(newRand(), 4<<20)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: int64(len(data)), Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Write(data)
	tw.Close()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithWindowSize(32<<20), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(raw.Bytes())
	enc.Close()
	return out.Bytes()
}

func TestUnpackRefusesHostileBundles(t *testing.T) {
	dev := func(name string, flag byte) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: flag, Name: name, Devmajor: 1, Devminor: 3}}
	}
	hard := func(name, target string) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
	}
	many := func(n int) []tarEntry {
		var es []tarEntry
		for i := 0; i < n; i++ {
			es = append(es, reg(fmt.Sprintf("f%d", i), ""))
		}
		return es
	}
	tests := []struct {
		name  string
		data  func(t testing.TB) []byte
		lim   bundle.UnpackLimits
		entry string // the UnsafeEntryError's entry, or
		rule  string // a word of its rule
		limit string // or the LimitError's limit, or
		text  string // or a word of any other error
	}{
		{name: "parent escape", data: func(t testing.TB) []byte { return tarZstd(t, reg("../x", "evil")) }, entry: "../x", rule: ".."},
		{name: "absolute path", data: func(t testing.TB) []byte { return tarZstd(t, reg("/etc/x", "evil")) }, entry: "/etc/x", rule: "absolute"},
		{name: "escape after a name", data: func(t testing.TB) []byte { return tarZstd(t, dir("a/"), reg("a/../../x", "evil")) }, entry: "a/../../x", rule: ".."},
		{name: "absolute symlink", data: func(t testing.TB) []byte { return tarZstd(t, symlink("etc", "/etc")) }, entry: "etc", rule: "absolute"},
		{name: "symlink up and out", data: func(t testing.TB) []byte { return tarZstd(t, dir("d/"), symlink("d/up", "../../outside")) }, entry: "d/up", rule: "leaves"},
		{name: "symlink .. after a name", data: func(t testing.TB) []byte {
			return tarZstd(t, symlink("a", "."), symlink("l", "a/../outside/sentinel"))
		}, entry: "l", rule: `".." after a name`},
		{name: "write through symlink to dot", data: func(t testing.TB) []byte {
			return tarZstd(t, symlink("a", "."), reg("a/x", "evil"))
		}, entry: "a/x", rule: "through the symlink"},
		{name: "write through symlink inside", data: func(t testing.TB) []byte {
			return tarZstd(t, dir("sub/"), symlink("a", "sub"), reg("a/passwd", "evil"))
		}, entry: "a/passwd", rule: "through the symlink"},
		{name: "write through absolute symlink", data: func(t testing.TB) []byte {
			return tarZstd(t, symlink("a", "/etc"), reg("a/passwd", "evil"))
		}, entry: "a", rule: "absolute"},
		{name: "hard link outside", data: func(t testing.TB) []byte { return tarZstd(t, hard("h", "/etc/passwd")) }, entry: "h", rule: "hard link"},
		{name: "hard link inside", data: func(t testing.TB) []byte { return tarZstd(t, reg("x", "a"), hard("h", "x")) }, entry: "h", rule: "hard link"},
		{name: "character device", data: func(t testing.TB) []byte { return tarZstd(t, dev("null", tar.TypeChar)) }, entry: "null", rule: "device"},
		{name: "block device", data: func(t testing.TB) []byte { return tarZstd(t, dev("sda", tar.TypeBlock)) }, entry: "sda", rule: "device"},
		{name: "fifo", data: func(t testing.TB) []byte { return tarZstd(t, dev("pipe", tar.TypeFifo)) }, entry: "pipe", rule: "fifo"},
		{name: "duplicate file", data: func(t testing.TB) []byte { return tarZstd(t, reg("x", "a"), reg("x", "b")) }, entry: "x", rule: "duplicate"},
		{name: "directory over a file", data: func(t testing.TB) []byte { return tarZstd(t, reg("x", "a"), dir("x/")) }, entry: "x", rule: "already"},
		{name: "file under a file", data: func(t testing.TB) []byte { return tarZstd(t, reg("x", "a"), reg("x/y", "b")) }, entry: "x/y", rule: "is a file"},
		{name: "file over a directory", data: func(t testing.TB) []byte { return tarZstd(t, dir("x/"), reg("x", "b")) }, entry: "x", rule: "directory"},
		{name: "too many entries", data: func(t testing.TB) []byte { return tarZstd(t, many(101)...) }, lim: bundle.UnpackLimits{MaxEntries: 100}, limit: "MaxEntries"},
		{name: "10 GiB of zeros declared", data: func(t testing.TB) []byte { return zeroBomb(t, 1, 10<<30) }, limit: "MaxBytes"},
		{name: "zeros past the byte limit", data: func(t testing.TB) []byte { return zeroBomb(t, 2, 20<<20) }, lim: bundle.UnpackLimits{MaxBytes: 32 << 20}, limit: "MaxBytes"},
		{name: "zstd window too large", data: wideWindow, lim: bundle.UnpackLimits{MaxDecoderMemory: 1 << 20}, limit: "MaxDecoderMemory"},
		{name: "truncated", data: func(t testing.TB) []byte {
			b := tarZstd(t, reg("a", strings.Repeat("x", 100000)), reg("b", "y"))
			return b[:len(b)/2]
		}, text: "truncated"},
		{name: "not zstd", data: func(t testing.TB) []byte { return []byte("PK\x03\x04 this is a zip file") }, text: "corrupt"},
		{name: "not tar", data: func(t testing.TB) []byte { return compress(t, bytes.Repeat([]byte("hello "), 200)) }, text: "corrupt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.data(t)
			s := newSandbox(t)
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			err := bundle.Unpack(context.Background(), bytes.NewReader(data), s.dest, tc.lim)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			var ue *bundle.UnsafeEntryError
			var le *bundle.LimitError
			switch {
			case err == nil:
				t.Fatalf("Unpack accepted the bundle; want a refusal")
			case tc.entry != "":
				if !errors.As(err, &ue) || ue.Entry != tc.entry || !strings.Contains(ue.Rule, tc.rule) {
					t.Fatalf("Unpack error = %v; want an UnsafeEntryError for %q saying %q", err, tc.entry, tc.rule)
				}
			case tc.limit != "":
				if !errors.As(err, &le) || le.Limit != tc.limit || !strings.Contains(err.Error(), tc.limit) {
					t.Fatalf("Unpack error = %v; want a LimitError naming %s", err, tc.limit)
				}
			default:
				if !strings.Contains(err.Error(), tc.text) {
					t.Fatalf("Unpack error = %v; want one saying %q", err, tc.text)
				}
			}
			s.empty(t)
			s.check(t)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 96<<20 {
				t.Errorf("Unpack allocated %d MiB refusing the bundle; want it to stop before decoding much", grew>>20)
			}
		})
	}
}

func TestUnpackClearsSpecialBits(t *testing.T) {
	data := tarZstd(t,
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755}, Data: []byte("x")},
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "sgid", Mode: 0o2755}, Data: []byte("x")},
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "sticky/", Mode: 0o1755}},
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "unreadable", Mode: 0o200}, Data: []byte("x")},
		tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: "readonly/", Mode: 0o555}},
	)
	s := newSandbox(t)
	if err := bundle.Unpack(context.Background(), bytes.NewReader(data), s.dest, bundle.UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		"suid": 0o755, "sgid": 0o755, "sticky": os.ModeDir | 0o755, "unreadable": 0o600, "readonly": os.ModeDir | 0o755,
	} {
		fi, err := os.Lstat(filepath.Join(s.dest, name))
		if err != nil {
			t.Fatal(err)
		}
		// The umask may take group and other bits away, never add them or special bits.
		if got := fi.Mode(); got&^0o077 != want&^0o077 || got&0o077&^want != 0 {
			t.Errorf("%s has mode %v, want %v (less the umask's group and other bits)", name, got, want)
		}
	}
}

func TestUnpackAcceptsGNUTarStyle(t *testing.T) {
	// GNU tar -C dir . writes "./" first and names with "./"; a tar need not list directories.
	data := tarZstd(t, dir("./"), reg("./roles/web/tasks/main.yml", "- debug: msg=hi\n"), dir("./roles/"),
		symlink("./roles/web/tasks/up", "../../../roles"), tarEntry{Hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}})
	s := newSandbox(t)
	if err := bundle.Unpack(context.Background(), bytes.NewReader(data), s.dest, bundle.UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	got := listTree(t, s.dest)
	want := map[string]string{
		"roles": "dir 755", "roles/web": "dir 755", "roles/web/tasks": "dir 755",
		"roles/web/tasks/main.yml": `file 644 "- debug: msg=hi\n"`, "roles/web/tasks/up": "-> ../../../roles",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s = %q, want %q", p, got[p], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("unpacked %v, want exactly %v", got, want)
	}
	s.check(t)
}

func TestUnpackNeedsEmptyDest(t *testing.T) {
	s := newSandbox(t)
	writeTree(t, s.dest, node{Path: "mine", Data: "keep"})
	err := bundle.Unpack(context.Background(), bytes.NewReader(tarZstd(t, reg("a", "b"))), s.dest, bundle.UnpackLimits{})
	if err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("Unpack into a non-empty directory: %v, want 'not empty'", err)
	}
	if b, err := os.ReadFile(filepath.Join(s.dest, "mine")); err != nil || string(b) != "keep" {
		t.Fatalf("the existing file is now %q, %v; want it kept", b, err)
	}
}

func TestUnpackCanceledCleansUp(t *testing.T) {
	data := tarZstd(t, reg("a", "x"), reg("b", "y"))
	s := newSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := bundle.Unpack(ctx, bytes.NewReader(data), s.dest, bundle.UnpackLimits{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unpack with a canceled context: %v, want context.Canceled", err)
	}
	s.empty(t)
}

// FuzzUnpack feeds arbitrary bytes as a bundle: Unpack must never panic, never write outside
// dest, never leave a symlink that resolves outside dest, and leave dest empty on error.
func FuzzUnpack(f *testing.F) {
	root := f.TempDir()
	writeTree(f, root,
		node{Path: "site.yml", Data: "- hosts: all\n"},
		node{Path: "roles/a/tasks/main.yml", Data: "- debug: msg=a\n"},
		node{Path: "roles/b", Link: "a"},
	)
	valid, _ := packBytes(f, root, bundle.PackOptions{})
	f.Add(valid)
	f.Add(tarZstd(f, symlink("a", "."), reg("a/x", "evil")))
	f.Add(tarZstd(f, dir("d/"), symlink("d/up", ".."), reg("d/up/x", "evil")))
	f.Add(tarZstd(f, reg("../x", "evil")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOne(t, data)
	})
}

// FuzzUnpackTar compresses the fuzzer's bytes first, so the mutations reach the tar reader
// and Unpack's own rules instead of dying in the zstd frame header.
func FuzzUnpackTar(f *testing.F) {
	for _, entries := range [][]tarEntry{
		{dir("a/"), reg("a/b", "x"), symlink("a/c", "b"), symlink("l", "a/c")},
		{symlink("a", "."), reg("a/x", "evil")},
		{dir("d/"), symlink("d/up", ".."), symlink("d/up2", "../.."), reg("d/up/x", "evil")},
		{reg("x", "a"), tarEntry{Hdr: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "x"}}},
	} {
		raw, err := zstd.NewReader(bytes.NewReader(tarZstd(f, entries...)))
		if err != nil {
			f.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(raw)
		raw.Close()
		f.Add(b.Bytes())
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		fuzzOne(t, compress(t, raw))
	})
}

func fuzzOne(t *testing.T, data []byte) {
	s := newSandbox(t)
	lim := bundle.UnpackLimits{MaxBytes: 1 << 20, MaxEntries: 500, MaxDecoderMemory: 8 << 20}
	err := bundle.Unpack(context.Background(), bytes.NewReader(data), s.dest, lim)
	if err != nil {
		s.empty(t)
	}
	s.check(t)
}
