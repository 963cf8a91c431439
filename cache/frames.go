package cache

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/internal/atomicfile"
	"github.com/rte-project/rte/protocol"
)

// Frame indexes (protocol feature bundle.frames). Beside each cached bundle of more than one
// zstd frame the cache keeps frames/<hex>.frames, one line per frame: "<offset> <size> <hex
// sha256>". Fill reads them to find frames of a bundle being received that some cached bundle
// already holds. An index is only a hint: every frame copied from it is hashed again, and the
// bundle as a whole is verified at Commit, so a stale, torn or planted index costs a transfer,
// never a wrong bundle.

const framesSuffix = ".frames"

func (c *Cache) framesPath(hash string) string {
	return filepath.Join(c.frames, strings.TrimPrefix(hash, "sha256:")+framesSuffix)
}

// writeFrames indexes the frames of the committed bundle at path. A bundle of one frame (packed
// before frames were cut, or tiny) gets no index: no other bundle can share its frame without
// being the same bundle.
func (c *Cache) writeFrames(hash, path string) {
	f, err := os.Open(path)
	if err != nil {
		c.log.Warn("indexing a bundle's frames failed; later bundles cannot reuse them", zap.String("bundle", hash), zap.Error(err))
		return
	}
	defer f.Close()
	frames, err := bundle.ScanFrames(f, protocol.MaxBundleFrames)
	if err != nil {
		// Verified against its name but not zstd as far as the scan can tell: Unpack will say
		// what is wrong with it; there is nothing to index.
		c.log.Debug("bundle not indexed", zap.String("bundle", hash), zap.Error(err))
		return
	}
	if len(frames) < 2 {
		return
	}
	var b bytes.Buffer
	for _, fr := range frames {
		fmt.Fprintf(&b, "%d %d %s\n", fr.Offset, fr.Size, hex.EncodeToString(fr.Hash[:]))
	}
	if err := atomicfile.WriteFile(c.framesPath(hash), b.Bytes(), 0o600); err != nil {
		c.log.Warn("indexing a bundle's frames failed; later bundles cannot reuse them", zap.String("bundle", hash), zap.Error(err))
	}
}

// frameAt is where a cached bundle holds a frame.
type frameAt struct {
	bundle string // "sha256:<hex>"
	offset int64
	size   int64
}

// findFrames looks up, in every frame index of the cache, the frames whose hashes are in want.
// Unreadable or malformed lines are skipped: they only make a frame look missing.
func (c *Cache) findFrames(want map[[32]byte]bool) map[[32]byte]frameAt {
	found := map[[32]byte]frameAt{}
	ents, err := os.ReadDir(c.frames)
	if err != nil {
		return found
	}
	for _, e := range ents {
		hexName, ok := strings.CutSuffix(e.Name(), framesSuffix)
		if !ok || !protocol.ValidHash("sha256:"+hexName) {
			continue
		}
		f, err := os.Open(filepath.Join(c.frames, e.Name()))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			parts := strings.Fields(sc.Text())
			if len(parts) != 3 || len(parts[2]) != 64 {
				continue
			}
			var h [32]byte
			if _, err := hex.Decode(h[:], []byte(parts[2])); err != nil || !want[h] {
				continue
			}
			off, err1 := strconv.ParseInt(parts[0], 10, 64)
			size, err2 := strconv.ParseInt(parts[1], 10, 64)
			if err1 != nil || err2 != nil || off < 0 || size < 1 {
				continue
			}
			if _, dup := found[h]; !dup {
				found[h] = frameAt{bundle: "sha256:" + hexName, offset: off, size: size}
			}
		}
		f.Close()
	}
	return found
}

// Fill copies into the bundle being received each of its frames (the app's bundle.frames
// index, in order from offset 0) that a cached bundle already holds, hashing every copied
// frame again, and returns the byte ranges still to be received, adjacent ones merged, and
// how many bytes it filled. Frames that do not add up to the announced size are an error.
// Nothing Fill does is trusted: Commit verifies the whole bundle against its name as always.
func (in *Incoming) Fill(frames []protocol.BundleFrame) (missing []protocol.ByteRange, filled int64, err error) {
	var total int64
	want := make(map[[32]byte]bool, len(frames))
	hashes := make([][32]byte, len(frames))
	for i, f := range frames {
		if f.Size < 1 || f.Size > in.size-total {
			return nil, 0, fmt.Errorf("bundle %s: frame %d of %d bytes goes past its announced size of %d bytes", in.hash, i, f.Size, in.size)
		}
		total += f.Size
		if _, err := hex.Decode(hashes[i][:], []byte(f.SHA256)); err != nil || len(f.SHA256) != 64 {
			return nil, 0, fmt.Errorf("bundle %s: frame %d: %q is not 64 hex digits", in.hash, i, protocol.PeerText(f.SHA256, 80))
		}
		want[hashes[i]] = true
	}
	if total != in.size {
		return nil, 0, fmt.Errorf("bundle %s: its frames add up to %d bytes, not to its announced size of %d bytes", in.hash, total, in.size)
	}
	found := in.c.findFrames(want)

	in.mu.Lock()
	defer in.mu.Unlock()
	if in.done {
		return nil, 0, fmt.Errorf("bundle %s: frames after the bundle was committed or aborted", in.hash)
	}
	in.inOrder = false // Commit reads the file back to hash it
	open := map[string]*os.File{}
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	var off int64
	for i, f := range frames {
		at, ok := found[hashes[i]]
		if ok && at.size == f.Size {
			ok, err = in.copyFrame(open, at, off, hashes[i])
			if err != nil {
				return nil, 0, err
			}
		}
		switch {
		case ok:
			filled += f.Size
		case len(missing) > 0 && missing[len(missing)-1].Offset+missing[len(missing)-1].Size == off:
			missing[len(missing)-1].Size += f.Size
		default:
			missing = append(missing, protocol.ByteRange{Offset: off, Size: f.Size})
		}
		off += f.Size
	}
	return missing, filled, nil
}

// copyFrame copies the frame at `at` into the bundle being received at off and reports
// whether the copied bytes hash to want. A source that is gone or reads short is not an
// error, only a frame to receive; failing to write the incoming file is.
func (in *Incoming) copyFrame(open map[string]*os.File, at frameAt, off int64, want [32]byte) (bool, error) {
	src := open[at.bundle]
	if src == nil {
		f, err := os.Open(in.c.bundlePath(at.bundle))
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil // evicted since it was indexed
		}
		if err != nil {
			return false, nil
		}
		open[at.bundle] = f
		src = f
	}
	h := sha256.New()
	w := io.MultiWriter(io.NewOffsetWriter(in.f, off), h)
	n, err := io.Copy(w, io.NewSectionReader(src, at.offset, at.size))
	var pe *fs.PathError
	if err != nil && errors.As(err, &pe) && pe.Path == in.f.Name() {
		return false, fmt.Errorf("bundle %s: write frame at offset %d: %w (check free space in RTE_CACHE_PATH)", in.hash, off, err)
	}
	if err != nil || n != at.size {
		return false, nil
	}
	return [32]byte(h.Sum(nil)) == want, nil
}

// sweepFrames removes frame indexes whose bundle is gone: one evicted between its commit and
// its index being written, or by a process killed between removing a bundle and its index.
// Such an index only costs a failed open in Fill, but would stay forever.
func (c *Cache) sweepFrames() error {
	ents, err := os.ReadDir(c.frames)
	if err != nil {
		return err
	}
	for _, e := range ents {
		hexName, ok := strings.CutSuffix(e.Name(), framesSuffix)
		if !ok || !protocol.ValidHash("sha256:"+hexName) || c.Has("sha256:"+hexName) {
			continue
		}
		if err := os.Remove(filepath.Join(c.frames, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
