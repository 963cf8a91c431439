package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rte-project/rte/protocol"
)

// Preparer makes a job's files ready inside dir, the job's private directory (0700, made by
// the Manager, removed by it when the job ends). The name dir/.rte is the Manager's own
// (extravars, secrets, ansible's local temp): a Preparer must not use it. Prepare runs in the
// job's goroutine; ctx ends when the job is canceled, times out or is abandoned. An error ends
// the job "error" with the error's text.
//
// LocalFiles is the Preparer of RTE_FILES=local; transfer mode's comes from the cache package.
type Preparer interface {
	Prepare(ctx context.Context, js *protocol.JobStart, dir string) (Workspace, error)
}

// Validator is implemented by a Preparer that can refuse a job before it is accepted: Start
// calls Validate and refuses the job "invalid" on an error (or with the *Refusal it returns,
// such as files_too_large). Validate must be quick, since Start returns at once.
type Validator interface {
	Validate(js *protocol.JobStart) error
}

// Workspace is where and on what ansible-playbook runs.
type Workspace struct {
	Dir         string   // working directory for ansible-playbook
	Playbook    string   // absolute path
	Inventories []string // absolute paths
	Release     func()   // called once when the job has ended; may be nil
}

// LocalFiles resolves playbooks under AnsiblePath (ANSIBLE_PATH) and inventories under
// RepoPath (REPO_PATH), for RTE_FILES=local. It refuses absolute paths, ".." elements, and
// symlinks that resolve outside their root. ansible-playbook runs in AnsiblePath, as it did in
// database mode, so an ansible.cfg there applies. Nothing is copied into the job directory.
type LocalFiles struct{ AnsiblePath, RepoPath string }

// Validate resolves every path of js, so a bad one is refused before the job is accepted.
func (l LocalFiles) Validate(js *protocol.JobStart) error {
	_, err := l.resolve(js)
	return err
}

// Prepare resolves the paths again (they may have changed since Validate).
func (l LocalFiles) Prepare(_ context.Context, js *protocol.JobStart, _ string) (Workspace, error) {
	return l.resolve(js)
}

func (l LocalFiles) resolve(js *protocol.JobStart) (Workspace, error) {
	if js.Files != nil {
		return Workspace{}, errors.New("files: this RTE runs with RTE_FILES=local and takes no bundles; send playbook and inventories as paths")
	}
	if l.AnsiblePath == "" {
		return Workspace{}, errors.New("playbook: ANSIBLE_PATH is not set on this RTE, so it cannot run local playbooks")
	}
	root, err := filepath.Abs(l.AnsiblePath)
	if err != nil {
		return Workspace{}, fmt.Errorf("ANSIBLE_PATH %s: %w", l.AnsiblePath, err)
	}
	pb, err := resolveUnder("ANSIBLE_PATH", root, js.Playbook, false)
	if err != nil {
		return Workspace{}, fmt.Errorf("playbook: %w", err)
	}
	ws := Workspace{Dir: root, Playbook: pb}
	if len(js.Inventories) > 0 && l.RepoPath == "" {
		return Workspace{}, errors.New("inventories: REPO_PATH is not set on this RTE, so it cannot use local inventories")
	}
	for i, inv := range js.Inventories {
		repo, err := filepath.Abs(l.RepoPath)
		if err != nil {
			return Workspace{}, fmt.Errorf("REPO_PATH %s: %w", l.RepoPath, err)
		}
		p, err := resolveUnder("REPO_PATH", repo, inv, true)
		if err != nil {
			return Workspace{}, fmt.Errorf("inventories[%d]: %w", i, err)
		}
		ws.Inventories = append(ws.Inventories, p)
	}
	return ws, nil
}

// resolveUnder returns the absolute path of rel under root, refusing anything that leaves root,
// through ".." or a symlink. An inventory may be a directory; a playbook must be a file.
func resolveUnder(rootName, root, rel string, dirOK bool) (string, error) {
	shown := protocol.PeerText(rel, 200)
	switch {
	case rel == "":
		return "", errors.New("must not be empty")
	case strings.ContainsRune(rel, 0):
		return "", fmt.Errorf("%q contains a NUL byte", shown)
	case filepath.IsAbs(rel):
		return "", fmt.Errorf("%q is absolute; give a path relative to %s", shown, rootName)
	}
	for _, part := range strings.Split(filepath.ToSlash(rel), "/") {
		if part == ".." {
			return "", fmt.Errorf("%q contains \"..\"; give a path inside %s", shown, rootName)
		}
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", rootName, root, err)
	}
	joined := filepath.Join(realRoot, rel)
	resolved, err := filepath.EvalSymlinks(joined)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%q does not exist under %s (%s)", shown, rootName, root)
		}
		return "", fmt.Errorf("%q: %w", shown, err)
	}
	inside, err := filepath.Rel(realRoot, resolved)
	if err != nil || inside == ".." || strings.HasPrefix(inside, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("%q resolves through a symlink to %s, outside %s", shown, resolved, rootName)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return "", fmt.Errorf("%q: %w", shown, err)
	}
	if fi.IsDir() && !dirOK {
		return "", fmt.Errorf("%q is a directory, not a playbook file", shown)
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%q is not a regular file", shown)
	}
	// The path as given, not the resolved one: ansible's playbook_dir and relative lookups
	// follow the name the operator used.
	return joined, nil
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
