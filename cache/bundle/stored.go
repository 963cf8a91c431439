package bundle

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/rte-project/rte/protocol"
)

// fileSuffix ends the name of a bundle kept in a directory: <hex>.tar.zst.
const fileSuffix = ".tar.zst"

// FilePath is where the bundle named name ("sha256:<hex>") is kept in dir. The app's Packer and
// the RTE's cache both keep bundles this way, and both evict by Stored.
func FilePath(dir, name string) string {
	return filepath.Join(dir, strings.TrimPrefix(name, "sha256:")+fileSuffix)
}

// StoredFile is one bundle kept in a directory.
type StoredFile struct {
	Name  string // "sha256:<hex>"
	Size  int64  // bytes on disk
	MTime time.Time
}

// Stored lists the bundles kept in dir, least recently used first (oldest mtime first, ties by
// name, so two callers evict in the same order), and their total size. Keepers touch a
// bundle's mtime when they use it. Files whose names are not <hex>.tar.zst are skipped, and so
// is a file removed while the list is made (another process evicting it).
func Stored(dir string) (files []StoredFile, total int64, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, err
	}
	for _, e := range ents {
		hexName, ok := strings.CutSuffix(e.Name(), fileSuffix)
		if !ok || !protocol.ValidHash("sha256:"+hexName) {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		files = append(files, StoredFile{"sha256:" + hexName, fi.Size(), fi.ModTime()})
		total += fi.Size()
	}
	slices.SortFunc(files, func(a, b StoredFile) int {
		if n := a.MTime.Compare(b.MTime); n != 0 {
			return n
		}
		return strings.Compare(a.Name, b.Name)
	})
	return files, total, nil
}
