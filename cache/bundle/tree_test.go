package bundle_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache/bundle"
)

// node is one path of a test tree: a file (Data), a directory (Dir) or a symlink (Link).
type node struct {
	Path string
	Data string
	Mode os.FileMode
	Dir  bool
	Link string
}

// writeTree makes nodes under root, with settled mtimes (an hour ago) so the Packer trusts them.
func writeTree(t testing.TB, root string, nodes ...node) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	for _, n := range nodes {
		p := filepath.Join(root, filepath.FromSlash(n.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case n.Dir:
			mode := n.Mode
			if mode == 0 {
				mode = 0o755
			}
			if err := os.MkdirAll(p, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		case n.Link != "":
			if err := os.Symlink(n.Link, p); err != nil {
				t.Fatal(err)
			}
			continue
		default:
			mode := n.Mode
			if mode == 0 {
				mode = 0o644
			}
			if err := os.WriteFile(p, []byte(n.Data), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
}

// settle moves every mtime under root an hour back, as if the tree had been written long ago.
func settle(t testing.TB, root string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return err
		}
		return os.Chtimes(p, old, old)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// words make text that compresses like YAML and Jinja does (about 4 to 6 times).
var words = strings.Fields(`name: hosts become yes tasks handlers when item loop register
	debug msg vars template src dest owner group mode service state started restarted present
	absent file directory package apt yum copy lineinfile notify listen {{ ansible_facts }}
	{{ item.name }} with_items changed_when failed_when block rescue always tags import_tasks
	include_role delegate_to run_once serial gather_facts true false - # nginx postgres redis`)

func newRand() *rand.Rand { return rand.New(rand.NewPCG(5, 6)) }

func text(r *rand.Rand, n int) []byte {
	var b bytes.Buffer
	for b.Len() < n {
		indent := r.IntN(4) * 2
		b.WriteString(strings.Repeat(" ", indent))
		for w := 0; w < 3+r.IntN(6); w++ {
			b.WriteString(words[r.IntN(len(words))])
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d\n", r.IntN(100000))
	}
	return b.Bytes()[:n]
}

// playbookTree writes files small files across roles/ totalling about total bytes: the shape
// of a real playbook repository.
func playbookTree(t testing.TB, root string, files int, total int64) int64 {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	dirs := []string{"tasks", "handlers", "templates", "files", "defaults", "vars", "meta"}
	var written int64
	for i := 0; i < files; i++ {
		role := fmt.Sprintf("roles/role%03d/%s", i/20, dirs[i%len(dirs)])
		p := filepath.Join(root, role, fmt.Sprintf("file%04d.yml", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		size := int(total / int64(files))
		size = size/2 + r.IntN(size+1)
		if err := os.WriteFile(p, text(r, size), 0o644); err != nil {
			t.Fatal(err)
		}
		written += int64(size)
	}
	if err := os.WriteFile(filepath.Join(root, "site.yml"), []byte("- hosts: all\n  roles: [role000]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	settle(t, root)
	return written
}

// largeTree writes a few large text-ish files totalling about total bytes, compressing about
// as well as the playbook tree does.
func largeTree(t testing.TB, root string, files int, total int64) int64 {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 4))
	var written int64
	for i := 0; i < files; i++ {
		data := text(r, int(total/int64(files)))
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("data%d.txt", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
		written += int64(len(data))
	}
	settle(t, root)
	return written
}

func packBytes(t testing.TB, dir string, opts bundle.PackOptions) ([]byte, string) {
	t.Helper()
	var buf bytes.Buffer
	name, size, err := bundle.Pack(context.Background(), dir, &buf, opts)
	if err != nil {
		t.Fatalf("Pack(%s): %v", dir, err)
	}
	if size != int64(buf.Len()) {
		t.Fatalf("Pack returned size %d, wrote %d bytes", size, buf.Len())
	}
	return buf.Bytes(), name
}

// tarZstd builds a bundle by hand, for the hostile cases Pack never writes. Each header is
// written as given; data follows a regular file's header.
type tarEntry struct {
	Hdr  tar.Header
	Data []byte
}

func tarZstd(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range entries {
		h := e.Hdr
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.Data))
		}
		if h.Mode == 0 && h.Typeflag != tar.TypeXGlobalHeader {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("write header %q: %v", h.Name, err)
		}
		if len(e.Data) > 0 {
			if _, err := tw.Write(e.Data); err != nil {
				t.Fatalf("write %q: %v", h.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return compress(t, raw.Bytes())
}

func compress(t testing.TB, raw []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(raw, nil)
}

func reg(name, data string) tarEntry {
	return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, Data: []byte(data)}
}

func dir(name string) tarEntry {
	return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func symlink(name, target string) tarEntry {
	return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target}}
}

// listTree returns every path under root with a short description, for comparisons.
func listTree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[rel] = "-> " + target
		case fi.IsDir():
			out[rel] = fmt.Sprintf("dir %o", fi.Mode().Perm())
		default:
			b, _ := os.ReadFile(p)
			out[rel] = fmt.Sprintf("file %o %q", fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky), clipText(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func clipText(b []byte) string {
	if len(b) > 40 {
		return fmt.Sprintf("%s...(%d bytes)", b[:40], len(b))
	}
	return string(b)
}
