package bundle

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/rte-project/rte/protocol"
	"golang.org/x/sys/unix"
)

// Defaults of UnpackLimits, used for every field left 0.
const (
	// DefaultMaxBytes bounds the file bytes a bundle unpacks to: four times the app's default
	// RTE_FILES_MAX_MB, so a directory the app agrees to send always fits.
	DefaultMaxBytes = 2 << 30
	// DefaultMaxEntries bounds files, directories and symlinks: far above a large playbook
	// repository, far below what exhausts inodes.
	DefaultMaxEntries = 100_000
	// DefaultMaxDecoderMemory bounds the zstd window, so the decoder's memory: Pack's level
	// uses 8 MiB, and a frame that asks for more than this is refused before it is allocated.
	DefaultMaxDecoderMemory = 64 << 20
)

// UnpackLimits bound what one bundle may cost. A zero field takes its default.
type UnpackLimits struct {
	MaxBytes         int64  // file bytes, as the tar headers declare them
	MaxEntries       int    // tar entries of any kind
	MaxDecoderMemory uint64 // largest zstd window accepted
}

func (l UnpackLimits) withDefaults() UnpackLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	if l.MaxDecoderMemory == 0 {
		l.MaxDecoderMemory = DefaultMaxDecoderMemory
	}
	return l
}

// LimitError says a bundle went past one of UnpackLimits.
type LimitError struct {
	Limit string // "MaxBytes", "MaxEntries" or "MaxDecoderMemory"
	Max   int64
	Entry string // the entry that went past it, when there is one
}

func (e *LimitError) Error() string {
	at := ""
	if e.Entry != "" {
		at = fmt.Sprintf(" at entry %q", e.Entry)
	}
	return fmt.Sprintf("bundle goes past the unpack limit %s (%d)%s: it is larger than this RTE unpacks, so send a smaller directory or mount it on the RTE (RTE_FILES=local)", e.Limit, e.Max, at)
}

// dirFDCacheSize bounds the directory descriptors Unpack keeps open. Entries arrive grouped
// by directory, so a small cache saves almost every re-open without nearing RLIMIT_NOFILE.
const dirFDCacheSize = 64

// Unpack extracts the bundle read from r into dest, which must be an existing, empty
// directory that nothing else writes to while Unpack runs. It creates only regular files,
// directories and symlinks, each with the bundle's permission bits less setuid, setgid and
// sticky (and less the process umask), files at least owner-readable and directories owner
// rwx so the tree can be read and removed. Symlinks may point only inside dest, by the rule
// Pack uses (see linkTarget), and no entry is written through an earlier symlink.
//
// On any error Unpack removes everything it created in dest and returns an
// *UnsafeEntryError, a *LimitError, the context's error, or an error describing the corrupt
// stream. It never fsyncs: a job directory does not outlive a crash.
func Unpack(ctx context.Context, r io.Reader, dest string, lim UnpackLimits) (err error) {
	lim = lim.withDefaults()
	if err := checkEmpty(dest); err != nil {
		return err
	}
	rootfd, err := unix.Open(dest, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open unpack destination %s: %w", dest, err)
	}
	u := &unpacker{
		root:  rootfd,
		lim:   lim,
		kinds: make(map[string]byte),
		dirs:  make(map[string]int),
	}
	defer func() {
		u.closeAll()
		if err != nil {
			if cerr := removeChildren(dest); cerr != nil {
				err = fmt.Errorf("%w (and cleaning %s failed: %v)", err, dest, cerr)
			}
		}
	}()
	// Buffered: the decoder reads frame and block headers a few bytes at a time, which would
	// be a syscall each on a file.
	zr, err := zstd.NewReader(bufio.NewReaderSize(r, 128<<10),
		zstd.WithDecoderMaxWindow(max(lim.MaxDecoderMemory, zstd.MinWindowSize)),
		zstd.WithDecoderMaxMemory(lim.MaxDecoderMemory),
		// Two: the next block decompresses on another core while this one's files are
		// written, which is where tar --zstd -x gets its speed from (two processes).
		zstd.WithDecoderConcurrency(2),
	)
	if err != nil {
		return fmt.Errorf("start zstd decoder: %w", err)
	}
	defer zr.Close()
	return u.run(ctx, tar.NewReader(zr))
}

func checkEmpty(dest string) error {
	f, err := os.Open(dest)
	if err != nil {
		return fmt.Errorf("open unpack destination %s: %w", dest, err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read unpack destination %s: %w", dest, err)
	}
	if len(names) > 0 {
		return fmt.Errorf("unpack destination %s is not empty (it holds %q); unpack only into a new directory", dest, names[0])
	}
	return nil
}

// Kinds of what Unpack created, by path.
const (
	kindDir  = 'd'
	kindFile = 'f'
	kindLink = 'l'
)

type unpacker struct {
	root    int
	lim     UnpackLimits
	kinds   map[string]byte // every path created, so parents can be checked without a syscall
	dirs    map[string]int  // open descriptors of directories, by path
	entries int
	bytes   int64
	buf     []byte
}

func (u *unpacker) run(ctx context.Context, tr *tar.Reader) error {
	u.buf = make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return u.readErr(err, "")
		}
		u.entries++
		if u.entries > u.lim.MaxEntries {
			return &LimitError{Limit: "MaxEntries", Max: int64(u.lim.MaxEntries), Entry: protocol.PeerText(hdr.Name, 200)}
		}
		// Counting declared sizes of every type, before reading, stops a bomb at its header:
		// nothing is decompressed for an entry that would go past the limit.
		if hdr.Size > u.lim.MaxBytes-u.bytes {
			return &LimitError{Limit: "MaxBytes", Max: u.lim.MaxBytes, Entry: protocol.PeerText(hdr.Name, 200)}
		}
		u.bytes += hdr.Size
		if err := u.entry(ctx, tr, hdr); err != nil {
			return err
		}
	}
}

func (u *unpacker) readErr(err error, entry string) error {
	if errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return &LimitError{Limit: "MaxDecoderMemory", Max: int64(u.lim.MaxDecoderMemory), Entry: protocol.PeerText(entry, 200)}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = errors.New("the bundle ends too early (truncated)")
	}
	if entry != "" {
		return fmt.Errorf("read bundle entry %q: %w", entry, err)
	}
	return fmt.Errorf("read bundle: %w (it is corrupt or not a tar.zst bundle)", err)
}

func (u *unpacker) entry(ctx context.Context, tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX defaults for later entries; nothing Unpack uses
	}
	name, rule := entryName(hdr.Name)
	if rule != "" {
		return unsafeEntry(hdr.Name, rule)
	}
	perm := uint32(hdr.Mode) & 0o777 // drops setuid, setgid and sticky
	switch hdr.Typeflag {
	case tar.TypeDir:
		if name == "" {
			return nil // "./": dest itself
		}
		return u.mkdir(name, perm|0o700)
	case tar.TypeReg:
		return u.file(ctx, tr, name, perm|0o400, hdr.Size)
	case tar.TypeSymlink:
		target, rule := linkTarget(name, hdr.Linkname)
		if rule != "" {
			return unsafeEntry(name, fmt.Sprintf("symlink to %q: %s", protocol.PeerText(hdr.Linkname, 200), rule))
		}
		return u.symlink(name, target)
	case tar.TypeLink:
		return unsafeEntry(name, "hard links are not accepted; Pack writes each file whole")
	case tar.TypeChar, tar.TypeBlock:
		return unsafeEntry(name, "device nodes are not accepted")
	case tar.TypeFifo:
		return unsafeEntry(name, "fifos are not accepted")
	default:
		return unsafeEntry(name, fmt.Sprintf("entry type %q is not accepted; only files, directories and symlinks", hdr.Typeflag))
	}
}

// entryName checks a tar name and returns it relative to dest without a trailing slash ("" for
// dest itself), or the rule it breaks. "./" prefixes, as GNU tar writes them, are accepted.
func entryName(name string) (string, string) {
	if name == "" {
		return "", "the name is empty"
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", "the name contains a NUL byte"
	}
	if strings.HasPrefix(name, "/") {
		return "", "the path is absolute"
	}
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	name = strings.TrimSuffix(name, "/")
	if name == "" || name == "." {
		return "", ""
	}
	for _, part := range strings.Split(name, "/") {
		switch part {
		case "..":
			return "", `the path has a ".." element`
		case "", ".":
			return "", "the path has an empty or \".\" element"
		}
	}
	return name, ""
}

// parent returns an open descriptor of the directory that will hold name, creating missing
// directories (a tar need not list them), and refuses a parent that is a symlink or a file.
func (u *unpacker) parent(name string) (int, string, error) {
	dir, base := path.Split(name)
	fd, err := u.dirFD(strings.TrimSuffix(dir, "/"), name)
	return fd, base, err
}

func (u *unpacker) dirFD(dir, entry string) (int, error) {
	if dir == "" {
		return u.root, nil
	}
	if fd, ok := u.dirs[dir]; ok {
		return fd, nil
	}
	switch u.kinds[dir] {
	case kindLink:
		return -1, unsafeEntry(entry, fmt.Sprintf("it would be written through the symlink %q", protocol.PeerText(dir, 200)))
	case kindFile:
		return -1, unsafeEntry(entry, fmt.Sprintf("its parent %q is a file", protocol.PeerText(dir, 200)))
	case 0:
		pfd, base, err := u.parent(dir)
		if err != nil {
			return -1, err
		}
		if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
			return -1, fmt.Errorf("create directory %s for %s: %w", dir, entry, err)
		}
		u.kinds[dir] = kindDir
	}
	pfd, base, err := u.parent(dir)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open directory %s: %w", dir, err)
	}
	if len(u.dirs) >= dirFDCacheSize {
		for k, old := range u.dirs {
			unix.Close(old)
			delete(u.dirs, k)
			break
		}
	}
	u.dirs[dir] = fd
	return fd, nil
}

func (u *unpacker) closeAll() {
	for k, fd := range u.dirs {
		unix.Close(fd)
		delete(u.dirs, k)
	}
	unix.Close(u.root)
}

func (u *unpacker) exists(name string) error {
	switch u.kinds[name] {
	case 0:
		return nil
	case kindDir:
		return unsafeEntry(name, "a directory of that name was already unpacked")
	default:
		return unsafeEntry(name, "an entry of that name was already unpacked (duplicates are refused)")
	}
}

func (u *unpacker) mkdir(name string, perm uint32) error {
	pfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	if u.kinds[name] == kindDir {
		// Made earlier as a missing parent: give it the mode its own entry carries.
		if err := unix.Fchmodat(pfd, base, perm, 0); err != nil {
			return fmt.Errorf("chmod directory %s: %w", name, err)
		}
		return nil
	}
	if err := u.exists(name); err != nil {
		return err
	}
	if err := unix.Mkdirat(pfd, base, perm); err != nil {
		return fmt.Errorf("create directory %s: %w", name, err)
	}
	u.kinds[name] = kindDir
	return nil
}

func (u *unpacker) symlink(name, target string) error {
	if err := u.exists(name); err != nil {
		return err
	}
	pfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(target, pfd, base); err != nil {
		return fmt.Errorf("create symlink %s: %w", name, err)
	}
	u.kinds[name] = kindLink
	return nil
}

func (u *unpacker) file(ctx context.Context, tr *tar.Reader, name string, perm uint32, size int64) error {
	if err := u.exists(name); err != nil {
		return err
	}
	pfd, base, err := u.parent(name)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("create file %s: %w", name, err)
	}
	u.kinds[name] = kindFile
	werr := u.copyTo(ctx, fd, tr, name, size)
	if cerr := unix.Close(fd); werr == nil && cerr != nil {
		werr = fmt.Errorf("write file %s: %w", name, cerr)
	}
	return werr
}

func (u *unpacker) copyTo(ctx context.Context, fd int, tr *tar.Reader, name string, size int64) error {
	for i := 0; size > 0; i++ {
		if i%16 == 15 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		n := int(min(size, int64(len(u.buf))))
		if _, err := io.ReadFull(tr, u.buf[:n]); err != nil {
			return u.readErr(err, name)
		}
		if err := writeAll(fd, u.buf[:n]); err != nil {
			return fmt.Errorf("write file %s: %w", name, err)
		}
		size -= int64(n)
	}
	return nil
}

func writeAll(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// removeChildren empties dir, making read-only directories writable first, since a
// directory without owner write (from a bundle or from a job) cannot be emptied.
func removeChildren(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var first error
	for _, e := range ents {
		if err := RemoveTree(filepath.Join(dir, e.Name())); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// RemoveTree removes p and everything under it like os.RemoveAll, first giving its
// directories owner rwx when that is what stops the removal. It never follows symlinks.
func RemoveTree(p string) error {
	err := os.RemoveAll(p)
	if err == nil || !errors.Is(err, os.ErrPermission) {
		return err
	}
	_ = filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}
