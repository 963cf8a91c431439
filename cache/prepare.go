package cache

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// Workspace is where and on what ansible-playbook runs: the jobs package's Workspace, which
// the RTE's wiring converts to.
type Workspace struct {
	Dir         string   // the unpacked playbooks bundle: ansible-playbook runs here, so its ansible.cfg applies
	Playbook    string   // absolute path
	Inventories []string // absolute paths, files or directories
	Release     func()   // removes what Prepare unpacked; safe to call more than once
}

// Names inside a job directory. The jobs package keeps ".rte" for itself.
const (
	projectDir   = "project"
	inventoryDir = "inventory"
)

// Validate checks a transfer-mode job.start without touching the disk: bundles are named, the
// job's bundles fit in the cache together (a *TooLargeError otherwise, which the RTE refuses
// as files_too_large), the inventories follow the rule below, and every path is relative and
// free of "..".
//
// Inventories: inventories[i] is a path inside an unpacked bundle, chosen by the number of
// inventory bundles in files.inventories:
//   - none: every inventory is inside the playbooks bundle (an inventory kept in the repository);
//   - one: every inventory is inside that bundle; with no names, the whole bundle is the inventory;
//   - several: inventories[i] is inside files.inventories[i], so there are as many names as
//     bundles; with no names, each whole bundle is an inventory.
func (c *Cache) Validate(js *protocol.JobStart) error {
	if js.Files == nil {
		return errors.New("files: this RTE runs with RTE_FILES=transfer and needs the job's bundles in files; send playbooks and inventories as bundles")
	}
	refs := append([]protocol.BundleRef{js.Files.Playbooks}, js.Files.Inventories...)
	var total int64
	for i, r := range refs {
		field := "files.playbooks"
		if i > 0 {
			field = fmt.Sprintf("files.inventories[%d]", i-1)
		}
		if !protocol.ValidHash(r.Hash) {
			return fmt.Errorf("%s.hash: %q is not sha256: and 64 lowercase hex digits", field, protocol.PeerText(r.Hash, 80))
		}
		if r.Size < 0 {
			return fmt.Errorf("%s.size: %d is negative", field, r.Size)
		}
		total += r.Size
	}
	if total > c.cfg.MaxBytes {
		return &TooLargeError{What: "the job's bundles", Size: total, Limit: c.cfg.MaxBytes}
	}
	if err := checkRel("playbook", js.Playbook); err != nil {
		return err
	}
	n, m := len(js.Files.Inventories), len(js.Inventories)
	if n > 1 && m != 0 && m != n {
		return fmt.Errorf("inventories: %d names for %d inventory bundles; give one name per bundle (inventories[i] is inside files.inventories[i]), or none to use each bundle whole", m, n)
	}
	for i, inv := range js.Inventories {
		if err := checkRel(fmt.Sprintf("inventories[%d]", i), inv); err != nil {
			return err
		}
	}
	return nil
}

func checkRel(field, rel string) error {
	shown := protocol.PeerText(rel, 200)
	switch {
	case rel == "":
		return fmt.Errorf("%s: must not be empty", field)
	case strings.IndexByte(rel, 0) >= 0:
		return fmt.Errorf("%s: %q contains a NUL byte", field, shown)
	case filepath.IsAbs(rel):
		return fmt.Errorf("%s: %q is absolute; give a path relative to its bundle", field, shown)
	}
	for _, part := range strings.Split(rel, "/") {
		if part == ".." {
			return fmt.Errorf("%s: %q contains \"..\"; give a path inside its bundle", field, shown)
		}
	}
	return nil
}

// Prepare makes a transfer-mode job's files ready: it unpacks the playbooks bundle into
// <dir>/project and inventory bundle i into <dir>/inventory/<i>, and resolves the playbook and
// inventories inside them (see Validate for the rule), refusing paths that leave their bundle
// through a symlink. Every bundle must already be in the cache; the caller asks for the
// missing ones first (Missing, Receive), holding its own pin (Acquire) meanwhile. Prepare pins
// the bundles while it reads them, and not after: an unpacked job no longer needs them, and a
// long job must not hold cache space it does not read.
//
// dir is the job's private directory, made by the jobs package; when it is "", Prepare makes
// one with JobDir and Release removes it too. On error, Prepare leaves nothing behind.
func (c *Cache) Prepare(ctx context.Context, js *protocol.JobStart, dir string) (ws Workspace, err error) {
	if err := c.Validate(js); err != nil {
		return Workspace{}, err
	}
	var made []string // removed by Release, or at once on error
	release := sync.OnceFunc(func() {
		for i := len(made) - 1; i >= 0; i-- {
			_ = bundle.RemoveTree(made[i]) // inside a job directory, which its owner removes anyway
		}
	})
	defer func() {
		if err != nil {
			release()
		}
	}()
	if dir == "" {
		d, _, err := c.JobDir(js.Job)
		if err != nil {
			return Workspace{}, err
		}
		dir = d
		made = append(made, d)
	}

	unpin, err := c.Acquire(hashesOf(js.Files)...)
	if err != nil {
		return Workspace{}, err
	}
	defer unpin()

	project := filepath.Join(dir, projectDir)
	made = append(made, project)
	if err := c.unpack(ctx, js.Files.Playbooks, project); err != nil {
		return Workspace{}, fmt.Errorf("files.playbooks: %w", err)
	}
	var invDirs []string
	if len(js.Files.Inventories) > 0 {
		inv := filepath.Join(dir, inventoryDir)
		made = append(made, inv)
		if err := os.Mkdir(inv, 0o700); err != nil {
			return Workspace{}, fmt.Errorf("make %s: %w", inv, err)
		}
		for i, ref := range js.Files.Inventories {
			d := filepath.Join(inv, strconv.Itoa(i))
			if err := c.unpack(ctx, ref, d); err != nil {
				return Workspace{}, fmt.Errorf("files.inventories[%d]: %w", i, err)
			}
			invDirs = append(invDirs, d)
		}
	}

	ws = Workspace{Dir: project, Release: release}
	if ws.Playbook, err = resolveIn(project, js.Playbook, false); err != nil {
		return Workspace{}, fmt.Errorf("playbook: %w", err)
	}
	switch {
	case len(js.Inventories) == 0:
		ws.Inventories = invDirs
	default:
		for i, name := range js.Inventories {
			root := project
			switch len(invDirs) {
			case 0:
			case 1:
				root = invDirs[0]
			default:
				root = invDirs[i]
			}
			p, err := resolveIn(root, name, true)
			if err != nil {
				return Workspace{}, fmt.Errorf("inventories[%d]: %w", i, err)
			}
			ws.Inventories = append(ws.Inventories, p)
		}
	}
	return ws, nil
}

func hashesOf(f *protocol.JobFiles) []string {
	out := []string{f.Playbooks.Hash}
	for _, r := range f.Inventories {
		out = append(out, r.Hash)
	}
	return out
}

// unpack extracts one cached bundle into dest, which it makes (0700).
func (c *Cache) unpack(ctx context.Context, ref protocol.BundleRef, dest string) error {
	f, err := os.Open(c.bundlePath(ref.Hash))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("bundle %s is not in the cache (never received, or evicted because RTE_CACHE_MB is too small for the jobs at hand)", ref.Hash)
	}
	if err != nil {
		return fmt.Errorf("open bundle %s: %w", ref.Hash, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat bundle %s: %w", ref.Hash, err)
	}
	if fi.Size() != ref.Size {
		return fmt.Errorf("bundle %s has %d bytes in the cache, but job.start says %d; the app's size is wrong", ref.Hash, fi.Size(), ref.Size)
	}
	if err := os.Mkdir(dest, 0o700); err != nil {
		return fmt.Errorf("make %s: %w", dest, err)
	}
	if err := bundle.Unpack(ctx, f, dest, c.cfg.Unpack); err != nil {
		if ctx.Err() != nil || isSystemError(err) {
			return fmt.Errorf("unpack bundle %s: %w", ref.Hash, err)
		}
		return &BadBundleError{Hash: ref.Hash, Err: err}
	}
	return nil
}

// resolveIn returns the absolute path of rel inside root, refusing one that leaves root
// through a symlink (checkRel already refused absolute paths and ".."). The path is returned
// as given, not resolved: ansible's playbook_dir and relative lookups follow the name used.
func resolveIn(root, rel string, dirOK bool) (string, error) {
	shown := protocol.PeerText(rel, 200)
	joined := filepath.Join(root, filepath.FromSlash(rel))
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	resolved, err := filepath.EvalSymlinks(joined)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%q is not in the bundle", shown)
	}
	if err != nil {
		return "", fmt.Errorf("%q: %w", shown, err)
	}
	inside, err := filepath.Rel(realRoot, resolved)
	if err != nil || inside == ".." || strings.HasPrefix(inside, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%q resolves through a symlink to %s, outside its bundle", shown, resolved)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", fmt.Errorf("%q: %w", shown, err)
	}
	switch {
	case fi.IsDir() && !dirOK:
		return "", fmt.Errorf("%q is a directory, not a playbook file", shown)
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return "", fmt.Errorf("%q is not a regular file", shown)
	}
	return joined, nil
}
