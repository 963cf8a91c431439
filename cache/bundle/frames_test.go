package bundle_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache/bundle"
)

// framedTree is a playbook tree of 300 small files plus one file big enough to be a frame of
// its own.
func framedTree(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	playbookTree(t, root, 300, 1<<20)
	writeTree(t, root, node{Path: "files/big.txt", Data: string(text(newRand(), 200<<10))})
	settle(t, root)
	return root
}

func packIndexed(t testing.TB, dir string) ([]byte, []bundle.Frame) {
	t.Helper()
	var buf bytes.Buffer
	name, size, frames, err := bundle.PackWithIndex(context.Background(), dir, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if size != int64(buf.Len()) || name != hashName(buf.Bytes()) {
		t.Fatalf("PackWithIndex returned %s, %d bytes for %d bytes hashing to %s", name, size, buf.Len(), hashName(buf.Bytes()))
	}
	return buf.Bytes(), frames
}

func hashName(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestPackFrameIndex: the index Pack records is the one ScanFrames reads back from the bytes,
// the frames tile the bundle, each hashes to its entry, and each decompresses on its own to
// whole tar blocks (a frame ends at an entry boundary, never inside an entry).
func TestPackFrameIndex(t *testing.T) {
	root := framedTree(t)
	data, frames := packIndexed(t, root)
	scanned, err := bundle.ScanFrames(bytes.NewReader(data), 0)
	if err != nil {
		t.Fatalf("ScanFrames of a packed bundle: %v", err)
	}
	if !reflect.DeepEqual(scanned, frames) {
		t.Fatalf("ScanFrames found %d frames, Pack recorded %d; they differ", len(scanned), len(frames))
	}
	if len(frames) < 10 {
		t.Fatalf("a tree of 300 files packed into %d frames, want its entries grouped into many", len(frames))
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var off int64
	var tarStream []byte
	bigAlone := false
	for i, f := range frames {
		if f.Offset != off {
			t.Fatalf("frame %d starts at %d, want %d (frames must tile the bundle)", i, f.Offset, off)
		}
		part := data[f.Offset : f.Offset+f.Size]
		if sha256.Sum256(part) != f.Hash {
			t.Fatalf("frame %d: recorded hash is not the sha256 of its bytes", i)
		}
		raw, err := dec.DecodeAll(part, nil)
		if err != nil {
			t.Fatalf("frame %d does not decompress on its own: %v", i, err)
		}
		if len(raw)%512 != 0 {
			t.Fatalf("frame %d holds %d tar bytes, not whole 512-byte blocks: it cuts an entry", i, len(raw))
		}
		if bytes.Contains(raw[:min(len(raw), 512)], []byte("files/big.txt")) && len(raw) < (200<<10)+2048 {
			bigAlone = true
		}
		tarStream = append(tarStream, raw...)
		off += f.Size
	}
	if off != int64(len(data)) {
		t.Fatalf("frames cover %d of %d bytes", off, len(data))
	}
	if !bigAlone {
		t.Errorf("files/big.txt (200 KiB) is not a frame of its own")
	}
	whole, err := dec.DecodeAll(data, nil)
	if err != nil || !bytes.Equal(whole, tarStream) {
		t.Fatalf("the frames decompressed one by one differ from the whole stream decompressed (err %v)", err)
	}
}

// TestFramedBundleReadsAsOne: a framed bundle is still one tar.zst, read by Unpack and by GNU
// tar --zstd -x alike.
func TestFramedBundleReadsAsOne(t *testing.T) {
	root := framedTree(t)
	data, _ := packIndexed(t, root)
	want := listTree(t, root)
	dest := t.TempDir()
	if err := bundle.Unpack(context.Background(), bytes.NewReader(data), dest, bundle.UnpackLimits{}); err != nil {
		t.Fatalf("Unpack of a framed bundle: %v", err)
	}
	if got := listTree(t, dest); !reflect.DeepEqual(got, want) {
		t.Fatalf("Unpack gave %d paths, want %d the same as the packed tree", len(got), len(want))
	}
	if _, err := exec.LookPath("zstd"); err != nil {
		t.Skip("zstd is not installed (apt-get install zstd): tar --zstd not tried")
	}
	file := filepath.Join(t.TempDir(), "b.tar.zst")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	dest = t.TempDir()
	if out, err := exec.Command("tar", "--zstd", "-xf", file, "-C", dest).CombinedOutput(); err != nil {
		t.Fatalf("tar --zstd -x of a framed bundle: %v\n%s", err, out)
	}
	if got := listTree(t, dest); !reflect.DeepEqual(got, want) {
		t.Fatalf("tar --zstd -x gave %d paths, want %d the same as the packed tree", len(got), len(want))
	}
}

// TestFramesOfOneChange: changing one small file changes one frame, the others keep their
// hashes, so an RTE holding the old bundle needs only that frame. Adding a file is the same.
func TestFramesOfOneChange(t *testing.T) {
	root := framedTree(t)
	_, before := packIndexed(t, root)
	changed := filepath.Join(root, "roles", "role007", "tasks", "file0140.yml")
	b, err := os.ReadFile(changed)
	if err != nil {
		t.Fatal(err)
	}
	// Longer by far: a cut rule based on sizes would shift every later frame.
	if err := os.WriteFile(changed, append(b, bytes.Repeat([]byte("- debug: msg=changed\n"), 100)...), 0o644); err != nil {
		t.Fatal(err)
	}
	_, after := packIndexed(t, root)
	if n := newFrames(before, after); n != 1 {
		t.Fatalf("after changing one file %d of %d frames are new, want 1", n, len(after))
	}
	writeTree(t, root, node{Path: "roles/role003/tasks/added.yml", Data: "- debug: msg=added\n"})
	_, added := packIndexed(t, root)
	if n := newFrames(after, added); n < 1 || n > 2 {
		t.Fatalf("after adding one file %d of %d frames are new, want 1 or 2", n, len(added))
	}
}

func newFrames(old, cur []bundle.Frame) int {
	have := map[[32]byte]bool{}
	for _, f := range old {
		have[f.Hash] = true
	}
	n := 0
	for _, f := range cur {
		if !have[f.Hash] {
			n++
		}
	}
	return n
}

func TestScanFramesRefuses(t *testing.T) {
	one := compress(t, []byte(strings.Repeat("x", 10000)))
	if fs, err := bundle.ScanFrames(bytes.NewReader(one), 0); err != nil || len(fs) != 1 || fs[0].Size != int64(len(one)) {
		t.Fatalf("a one-frame stream scanned as %v, %v; want one frame of %d bytes", fs, err, len(one))
	}
	two := append(append([]byte{}, one...), one...)
	if _, err := bundle.ScanFrames(bytes.NewReader(two), 1); err == nil || !strings.Contains(err.Error(), "more than 1") {
		t.Errorf("two frames with a limit of 1: %v, want a refusal naming the limit", err)
	}
	for name, c := range map[string]struct {
		data []byte
		says string
	}{
		"empty":     {nil, "empty"},
		"not zstd":  {[]byte("hello, this is not zstd at all"), "magic"},
		"truncated": {one[:len(one)-3], "unexpected EOF"},
		"header":    {one[:5], "unexpected EOF"},
	} {
		if _, err := bundle.ScanFrames(bytes.NewReader(c.data), 0); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: ScanFrames = %v, want an error saying %q", name, err, c.says)
		}
	}
}

// FuzzScanFrames: ScanFrames is a hand-written parser of bytes from the peer. It must never
// panic, and whatever it accepts must be frames that tile the input and hash to their bytes.
func FuzzScanFrames(f *testing.F) {
	one := compress(f, []byte(strings.Repeat("frame ", 300)))
	f.Add(one)
	f.Add(append(append([]byte{}, one...), one...))
	f.Add([]byte{0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3}) // a skippable frame
	f.Add(one[:len(one)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		frames, err := bundle.ScanFrames(bytes.NewReader(data), 1000)
		if err != nil {
			return
		}
		var off int64
		for i, fr := range frames {
			if fr.Offset != off || fr.Size < 1 || fr.Offset+fr.Size > int64(len(data)) {
				t.Fatalf("frame %d at %d of %d bytes does not tile %d bytes", i, fr.Offset, fr.Size, len(data))
			}
			if sha256.Sum256(data[fr.Offset:fr.Offset+fr.Size]) != fr.Hash {
				t.Fatalf("frame %d: hash is not of its bytes", i)
			}
			off += fr.Size
		}
		if off != int64(len(data)) {
			t.Fatalf("frames cover %d of %d bytes", off, len(data))
		}
	})
}
