package cache_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/protocol"
)

var project = files{
	"site.yml":                 "- hosts: all\n  roles: [web]\n",
	"roles/web/tasks/main.yml": "- debug: msg=hi\n",
	"inventories/hosts.yml":    "all:\n  hosts: {a: {}}\n",
	"ansible.cfg":              "[defaults]\n",
}

// stock receives bundles into c and returns their references.
func stock(t *testing.T, c *cache.Cache, trees ...files) []protocol.BundleRef {
	t.Helper()
	var refs []protocol.BundleRef
	for _, tree := range trees {
		data, hash := makeBundle(t, tree)
		receive(t, c, hash, data, 1<<20)
		refs = append(refs, protocol.BundleRef{Hash: hash, Size: int64(len(data))})
	}
	return refs
}

func jobStart(playbook string, inventories []string, refs []protocol.BundleRef) *protocol.JobStart {
	js := &protocol.JobStart{Job: "1042", Playbook: playbook, Inventories: inventories,
		Files: &protocol.JobFiles{Playbooks: refs[0]}}
	js.Files.Inventories = refs[1:]
	return js
}

func TestPrepareInventoryRules(t *testing.T) {
	c := openCache(t, t.TempDir(), "rte-a", 1<<30, nil)
	refs := stock(t, c, project, files{"prod.yml": "all: {}\n", "test.yml": "all: {}\n"}, files{"hosts.ini": "[web]\n"})
	pb, inv1, inv2 := refs[0], refs[1], refs[2]
	tests := []struct {
		name        string
		inventories []string
		refs        []protocol.BundleRef
		want        []string // relative to the job directory
	}{
		{"inside the playbooks bundle", []string{"inventories/hosts.yml"}, []protocol.BundleRef{pb}, []string{"project/inventories/hosts.yml"}},
		{"all inside one inventory bundle", []string{"prod.yml", "test.yml"}, []protocol.BundleRef{pb, inv1}, []string{"inventory/0/prod.yml", "inventory/0/test.yml"}},
		{"one bundle used whole", nil, []protocol.BundleRef{pb, inv1}, []string{"inventory/0"}},
		{"one name per bundle", []string{"test.yml", "hosts.ini"}, []protocol.BundleRef{pb, inv1, inv2}, []string{"inventory/0/test.yml", "inventory/1/hosts.ini"}},
		{"several bundles used whole", nil, []protocol.BundleRef{pb, inv1, inv2}, []string{"inventory/0", "inventory/1"}},
		{"no inventory", nil, []protocol.BundleRef{pb}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ws, err := c.Prepare(context.Background(), jobStart("site.yml", tc.inventories, tc.refs), dir)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if ws.Dir != filepath.Join(dir, "project") || ws.Playbook != filepath.Join(dir, "project", "site.yml") {
				t.Errorf("Dir %s, Playbook %s; want %s/project and its site.yml", ws.Dir, ws.Playbook, dir)
			}
			var want []string
			for _, w := range tc.want {
				want = append(want, filepath.Join(dir, w))
			}
			if !slices.Equal(ws.Inventories, want) {
				t.Errorf("Inventories = %v, want %v", ws.Inventories, want)
			}
			for _, p := range append([]string{ws.Playbook}, ws.Inventories...) {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s: %v", p, err)
				}
			}
			ws.Release()
			ws.Release()
			if got := dirNames(t, dir); len(got) != 0 {
				t.Errorf("job directory holds %v after Release, want it emptied (the directory itself is the caller's)", got)
			}
		})
	}
}

func TestPrepareMakesAndRemovesItsOwnJobDir(t *testing.T) {
	dir := t.TempDir()
	c := openCache(t, dir, "rte-a", 1<<30, nil)
	refs := stock(t, c, project)
	ws, err := c.Prepare(context.Background(), jobStart("site.yml", nil, refs), "")
	if err != nil {
		t.Fatal(err)
	}
	jobDir := filepath.Join(dir, "rtes", "rte-a", "jobs", "1042")
	if ws.Dir != filepath.Join(jobDir, "project") {
		t.Fatalf("Dir = %s, want %s/project", ws.Dir, jobDir)
	}
	if fi, err := os.Stat(jobDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("job directory %v (%v), want mode 0700", fi.Mode(), err)
	}
	ws.Release()
	if _, err := os.Stat(jobDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("job directory still there after Release: %v", err)
	}
}

func TestPrepareUnpinsAfterUnpacking(t *testing.T) {
	dir := t.TempDir()
	data, hash := randomBundle(t, 20_000)
	c := openCache(t, dir, "rte-a", int64(len(data)), nil)
	receive(t, c, hash, data, 1<<20)
	js := &protocol.JobStart{Job: "1", Playbook: "data", Files: &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: hash, Size: int64(len(data))}}}
	ws, err := c.Prepare(context.Background(), js, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Release()
	other, otherHash := randomBundle(t, 20_000)
	receive(t, c, otherHash, other, 1<<20)
	if c.Has(hash) {
		t.Fatal("a prepared job's bundle is still pinned: it was not evicted for a newer one")
	}
	if _, err := os.Stat(ws.Playbook); err != nil {
		t.Fatalf("the unpacked job lost its files when the bundle was evicted: %v", err)
	}
}

// hostileBundle is a bundle that unpacks one good file and then tries to escape.
func hostileBundle(t *testing.T) ([]byte, string) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "site.yml", Size: 3, Mode: 0o644})
	tw.Write([]byte("x\n\n"))
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "etc", Linkname: "/etc", Mode: 0o777})
	tw.Close()
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	data := enc.EncodeAll(raw.Bytes(), nil)
	return data, hashOf(data)
}

func TestPrepareRefuses(t *testing.T) {
	c := openCache(t, t.TempDir(), "rte-a", 1<<20, nil)
	refs := stock(t, c, project, files{"prod.yml": "x"}, files{"test.yml": "y"})
	hostile, hostileHash := hostileBundle(t)
	receive(t, c, hostileHash, hostile, 1<<20)
	absent := protocol.BundleRef{Hash: "sha256:" + strings.Repeat("cd", 32), Size: 10}
	tests := []struct {
		name string
		js   *protocol.JobStart
		want string
	}{
		{"no files", &protocol.JobStart{Job: "1", Playbook: "site.yml"}, "RTE_FILES=transfer"},
		{"playbook with ..", jobStart("../site.yml", nil, refs[:1]), `".."`},
		{"absolute playbook", jobStart("/etc/passwd", nil, refs[:1]), "absolute"},
		{"playbook not in the bundle", jobStart("nope.yml", nil, refs[:1]), "not in the bundle"},
		{"playbook is a directory", jobStart("roles", nil, refs[:1]), "directory"},
		{"inventory not in its bundle", jobStart("site.yml", []string{"hosts.yml"}, refs[:2]), "not in the bundle"},
		{"names do not match bundles", jobStart("site.yml", []string{"a", "b", "c"}, refs), "3 names for 2 inventory bundles"},
		{"bundle not in the cache", jobStart("site.yml", nil, []protocol.BundleRef{absent}), "not in the cache"},
		{"size differs", jobStart("site.yml", nil, []protocol.BundleRef{{Hash: refs[0].Hash, Size: refs[0].Size + 1}}), "job.start says"},
		{"too large for the cache", jobStart("site.yml", nil, []protocol.BundleRef{{Hash: refs[0].Hash, Size: 2 << 20}}), "RTE_CACHE_MB"},
		{"hostile bundle", jobStart("site.yml", nil, []protocol.BundleRef{{Hash: hostileHash, Size: int64(len(hostile))}}), "absolute"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := c.Prepare(context.Background(), tc.js, dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Prepare error = %v, want one saying %q", err, tc.want)
			}
			if got := dirNames(t, dir); len(got) != 0 {
				t.Fatalf("job directory holds %v after a refusal, want nothing", got)
			}
		})
	}
	var tl *cache.TooLargeError
	if err := c.Validate(jobStart("site.yml", nil, []protocol.BundleRef{{Hash: refs[0].Hash, Size: 2 << 20}})); !errors.As(err, &tl) {
		t.Errorf("Validate of bundles larger than the cache: %v, want a *cache.TooLargeError (files_too_large)", err)
	}
}
