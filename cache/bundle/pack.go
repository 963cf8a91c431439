package bundle

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/rte-project/rte/protocol"
	"golang.org/x/sys/unix"
)

// FixedModTime is the mtime of every entry Pack writes: 2000-01-01 00:00:00 UTC. Real mtimes
// would give a fresh checkout of unchanged files a new name, and the RTE would fetch it again.
var FixedModTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// zstdLevel is fixed: the same tree must compress to the same bytes, so the same name, on
// every app node. A newer compressor may still encode differently; then each directory is
// sent once more under its new name, which costs a transfer and nothing else.
const zstdLevel = zstd.SpeedDefault

// PackOptions tune Pack and Packer.
type PackOptions struct {
	// MaxBytes refuses a directory whose regular files hold more than this many bytes,
	// uncompressed, with a *TooLargeError (RTE_FILES_MAX_MB << 20 on the app). 0 means no limit.
	MaxBytes int64
	// Exclude leaves out more entries than Excluded does. rel is slash-separated and relative
	// to the packed directory; true for a directory leaves out everything under it.
	Exclude func(rel string, d fs.DirEntry) bool
}

// TooLargeError says a directory holds more file bytes than PackOptions.MaxBytes allows.
type TooLargeError struct {
	Dir   string
	Size  int64 // bytes of regular files that would have been packed
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("directory %s holds %s of files, more than the %s that may be sent to an RTE (RTE_FILES_MAX_MB); "+
		"mount it on the RTE instead (RTE_FILES=local with ANSIBLE_PATH and REPO_PATH) or make it smaller",
		e.Dir, mib(e.Size), mib(e.Limit))
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// UnsafeEntryError names an entry that Pack or Unpack refused and the rule it broke.
type UnsafeEntryError struct {
	Entry string // slash-separated path inside the bundle, as found (bounded)
	Rule  string
}

func (e *UnsafeEntryError) Error() string {
	return fmt.Sprintf("bundle entry %q refused: %s", e.Entry, e.Rule)
}

func unsafeEntry(name, rule string) error {
	return &UnsafeEntryError{Entry: protocol.PeerText(name, 200), Rule: rule}
}

// sshIdentities are the file names ssh-keygen gives private keys by default. Only names are
// matched: a role may well ship a TLS key in a .pem file on purpose (it should be vaulted), and
// refusing every .pem would break those playbooks.
var sshIdentities = map[string]bool{
	"id_rsa": true, "id_dsa": true, "id_ecdsa": true, "id_ecdsa_sk": true,
	"id_ed25519": true, "id_ed25519_sk": true, "id_xmss": true,
}

// excludedDirs are never packed: .ssh holds the app host's keys (the RTE uses its own), and
// version-control metadata is large, useless to ansible-playbook, and changes on every fetch,
// which would give an unchanged tree a new name.
var excludedDirs = map[string]bool{".ssh": true, ".git": true, ".hg": true, ".svn": true}

// Excluded reports whether Pack always leaves out an entry of this base name: a directory
// named .ssh, .git, .hg or .svn, or a file named like an SSH private identity (id_rsa, id_dsa,
// id_ecdsa, id_ecdsa_sk, id_ed25519, id_ed25519_sk, id_xmss).
func Excluded(name string, isDir bool) bool {
	if isDir {
		return excludedDirs[name]
	}
	return sshIdentities[name]
}

// entry is one path Pack will write, as found by scan.
type entry struct {
	rel    string      // slash-separated, relative to the root
	mode   fs.FileMode // type and permission bits as on disk
	size   int64       // regular files only
	mtime  int64       // regular files, nanoseconds; for the Packer's signature and the racy check
	target string      // symlinks: the normalised target
}

// Pack writes dir as a bundle to w and returns its name ("sha256:<hex>" of the bytes written)
// and size. dir may be a symlink to the directory. Pack reads every file once; nothing is
// written to w when the directory is refused (too large, an unsafe symlink, a device), since
// the whole tree is checked before the first byte is compressed.
func Pack(ctx context.Context, dir string, w io.Writer, opts PackOptions) (name string, size int64, err error) {
	root, err := resolveRoot(dir)
	if err != nil {
		return "", 0, err
	}
	entries, err := scan(ctx, root, opts)
	if err != nil {
		return "", 0, err
	}
	name, size, _, err = writeBundle(ctx, root, entries, w)
	return name, size, err
}

func resolveRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("pack %s: %w", dir, err)
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("pack %s: %w", dir, err)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return "", fmt.Errorf("pack %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("pack %s: not a directory", dir)
	}
	if Excluded(filepath.Base(root), true) {
		return "", fmt.Errorf("pack %s: a %s directory is never sent to an RTE", dir, filepath.Base(root))
	}
	return root, nil
}

// scan walks root and returns what Pack would write, checking every rule and the size limit
// before anything is read or compressed.
func scan(ctx context.Context, root string, opts PackOptions) ([]entry, error) {
	prefix := root
	if !strings.HasSuffix(prefix, string(filepath.Separator)) {
		prefix += string(filepath.Separator)
	}
	var (
		entries []entry
		total   int64
	)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if p == root {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, prefix))
		if Excluded(d.Name(), d.IsDir()) || (opts.Exclude != nil && opts.Exclude(rel, d)) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		e := entry{rel: rel, mode: fi.Mode()}
		switch {
		case fi.IsDir():
		case fi.Mode().IsRegular():
			e.size = fi.Size()
			e.mtime = fi.ModTime().UnixNano()
			total += e.size
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("read symlink %s: %w", p, err)
			}
			norm, rule := linkTarget(rel, t)
			if rule != "" {
				return unsafeEntry(rel, fmt.Sprintf("symlink to %q: %s; the RTE would not have its target", protocol.PeerText(t, 200), rule))
			}
			e.target = norm
		default:
			return unsafeEntry(rel, fmt.Sprintf("is a %s; only regular files, directories and symlinks are sent, so remove it or exclude it", kindName(fi.Mode())))
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", root, err)
	}
	if opts.MaxBytes > 0 && total > opts.MaxBytes {
		return nil, &TooLargeError{Dir: root, Size: total, Limit: opts.MaxBytes}
	}
	return entries, nil
}

func kindName(m fs.FileMode) string {
	switch {
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	default:
		return "file of mode " + m.String()
	}
}

// linkTarget checks a symlink target found at linkRel and returns it normalised (no empty or
// "." elements), or the rule it breaks. Pack and Unpack apply the same rule: the target is
// relative, its ".." elements all come first, and there are no more of them than the link's
// directory is deep. A ".." after a name is refused because that name may itself be a symlink
// (a -> . makes a/../x leave the tree), and only a leading run can be checked by counting.
func linkTarget(linkRel, target string) (string, string) {
	switch {
	case target == "":
		return "", "the target is empty"
	case strings.IndexByte(target, 0) >= 0:
		return "", "the target contains a NUL byte"
	case strings.HasPrefix(target, "/"):
		return "", "the target is absolute; only relative targets inside the bundle are allowed"
	}
	var (
		out   []string
		ups   int
		named bool
	)
	for _, part := range strings.Split(target, "/") {
		switch part {
		case "", ".":
			continue
		case "..":
			if named {
				return "", `the target has ".." after a name, which can leave the tree through another symlink`
			}
			ups++
		default:
			named = true
		}
		out = append(out, part)
	}
	if ups > strings.Count(linkRel, "/") {
		return "", "the target leaves the bundle's directory"
	}
	if len(out) == 0 {
		return ".", ""
	}
	return strings.Join(out, "/"), ""
}

// writeBundle writes entries, found under root by scan, as tar+zstd to w, one zstd frame per
// group of entries (see framer), and returns the bundle's name, size and frame index.
func writeBundle(ctx context.Context, root string, entries []entry, w io.Writer) (string, int64, []Frame, error) {
	h := sha256.New()
	// Buffered: every frame ends with a flush of the encoder's small writes (frame header,
	// last block, checksum), which would be system calls of a few bytes each on a file.
	bw := bufio.NewWriterSize(w, 256<<10)
	cw := &countingWriter{w: bw, h: h}
	zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstdLevel), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return "", 0, nil, fmt.Errorf("start zstd encoder: %w", err)
	}
	defer zw.Close()
	fr := &framer{out: cw, zw: zw, fh: sha256.New()}
	cw.frame = fr.fh
	tw := tar.NewWriter(fr)
	buf := make([]byte, 256<<10)
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return "", 0, nil, err
		}
		hdr := &tar.Header{
			Name:    e.rel,
			Mode:    int64(e.mode.Perm()),
			ModTime: FixedModTime,
		}
		switch {
		case e.mode.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case e.mode&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = e.target
		default:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = e.size
		}
		big := hdr.Typeflag == tar.TypeReg && e.size >= bigEntry
		if big {
			if err := fr.cut(); err != nil {
				return "", 0, nil, fmt.Errorf("pack %s: %w", root, err)
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", 0, nil, fmt.Errorf("pack %s: write header of %s: %w", root, e.rel, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFile(tw, root, e, buf); err != nil {
				return "", 0, nil, fmt.Errorf("pack %s: %w", root, err)
			}
		}
		// Flush writes the entry's padding, so the entry ends inside its frame.
		if err := tw.Flush(); err != nil {
			return "", 0, nil, fmt.Errorf("pack %s: write %s: %w", root, e.rel, err)
		}
		if big || cutAfter(e.rel) || fr.raw >= maxFrameRaw {
			if err := fr.cut(); err != nil {
				return "", 0, nil, fmt.Errorf("pack %s: %w", root, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return "", 0, nil, fmt.Errorf("pack %s: finish tar: %w", root, err)
	}
	if err := fr.cut(); err != nil {
		return "", 0, nil, fmt.Errorf("pack %s: finish zstd: %w", root, err)
	}
	if err := bw.Flush(); err != nil {
		return "", 0, nil, fmt.Errorf("pack %s: %w", root, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), cw.n, fr.frames, nil
}

// Where Pack cuts the zstd stream into frames. Frames exist so that an RTE holding an older
// bundle of the same directory can reuse the frames that did not change (protocol feature
// bundle.frames) and fetch only the others. A cut is placed at an entry boundary:
//
//   - after an entry whose path hashes to 0 modulo cutEvery: the cut points depend on names
//     only, so a file whose content or size changes moves no cut, and adding or removing a
//     file changes only its own frame. (Cutting once a frame holds N bytes would shift every
//     later cut when one file grows, and the RTE could reuse nothing after it.)
//   - before and after a file of at least bigEntry bytes: it is a frame of its own, so a
//     change elsewhere never resends it, and a change to it resends only it;
//   - after an entry once the frame holds maxFrameRaw bytes, bounding what one small change
//     resends when many names in a row miss the hash; the next name cut resynchronises.
//
// cutEvery trades bytes saved by compressing small files together against bytes resent per
// change and the size of the index; docs/files-and-cache.md has the measurements.
const (
	cutEvery    = 16
	bigEntry    = 64 << 10
	maxFrameRaw = 1 << 20
)

// cutAfter reports whether the name rule cuts a frame after the entry rel (FNV-1a, 64 bits).
func cutAfter(rel string) bool {
	h := fnv.New64a()
	h.Write([]byte(rel))
	return h.Sum64()%cutEvery == 0
}

// Frame is one zstd frame of a bundle: Size compressed bytes at Offset, whose SHA-256 is Hash.
// Concatenated frames are one valid zstd stream, so a framed bundle is read like any other.
type Frame struct {
	Offset int64
	Size   int64
	Hash   [32]byte
}

// framer is the tar writer's sink: it starts a zstd frame at the first byte after a cut and
// ends it at the next cut, recording each frame's offset, size and hash.
type framer struct {
	out    *countingWriter
	zw     *zstd.Encoder
	fh     hash.Hash // the open frame's compressed bytes, fed by out
	open   bool
	start  int64 // offset of the open frame
	raw    int64 // uncompressed bytes in the open frame
	frames []Frame
}

func (f *framer) Write(p []byte) (int, error) {
	if !f.open {
		f.zw.Reset(f.out)
		f.fh.Reset()
		f.start = f.out.n
		f.raw = 0
		f.open = true
	}
	f.raw += int64(len(p))
	return f.zw.Write(p)
}

// cut ends the open frame, if any.
func (f *framer) cut() error {
	if !f.open {
		return nil
	}
	f.open = false
	if err := f.zw.Close(); err != nil {
		return err
	}
	fr := Frame{Offset: f.start, Size: f.out.n - f.start}
	f.fh.Sum(fr.Hash[:0])
	f.frames = append(f.frames, fr)
	return nil
}

// ChangedError is Pack's error for a file that changed between the scan and its copy (it was
// being written): a caller may pack again once the writing is done.
type ChangedError struct {
	Path string
	How  string // "changed", or "shrank" when it was cut short during the copy
}

func (e *ChangedError) Error() string {
	return e.Path + " " + e.How + " while it was being packed; pack again once it is written"
}

// copyFile copies exactly e.size bytes of the file e into tw. It refuses a file that changed
// since scan looked at it: the tar header already promised a size, and the Packer's cache key
// already promised a content. Raw descriptors, not os.File: registering each of thousands of
// small files with the runtime poller costs more than reading them.
func copyFile(tw io.Writer, root string, e entry, buf []byte) error {
	p := filepath.Join(root, filepath.FromSlash(e.rel))
	// O_NOFOLLOW: a file swapped for a symlink since scan must not pull in its target.
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != e.size || st.Mtim.Nano() != e.mtime {
		return &ChangedError{Path: p, How: "changed"}
	}
	for left := e.size; left > 0; {
		n, err := unix.Read(fd, buf[:min(left, int64(len(buf)))])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if n == 0 {
			return &ChangedError{Path: p, How: "shrank"}
		}
		if _, err := tw.Write(buf[:n]); err != nil {
			return err
		}
		left -= int64(n)
	}
	return nil
}

type countingWriter struct {
	w     io.Writer
	h     hash.Hash
	frame hash.Hash // the open frame's hash, when framing
	n     int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	if c.frame != nil {
		c.frame.Write(p[:n])
	}
	c.n += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}
