package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/internal/refapp/settings"
)

func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newTestSource(t *testing.T, maxMB int) (*BundleSource, *settings.Settings) {
	t.Helper()
	dir := t.TempDir()
	s := &settings.Settings{
		DB: filepath.Join(dir, "app.db"), FilesMaxMB: maxMB, BundleCacheMB: 64,
		PlaybooksPath: filepath.Join(dir, "playbooks"), InventoryPath: filepath.Join(dir, "inventory"),
	}
	writeTree(t, s.PlaybooksPath, map[string]string{"site.yml": "- hosts: all\n", "roles/web/tasks/main.yml": "- ping:\n", ".ssh/id_ed25519": "key"})
	writeTree(t, s.InventoryPath, map[string]string{"hosts.yml": "all: {}\n"})
	src, err := NewBundleSource(s, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return src, s
}

func TestBundleSourcePacksAndServes(t *testing.T) {
	src, s := newTestSource(t, 1)
	if want := filepath.Join(filepath.Dir(s.DB), "app-bundles"); src.cacheDir != want {
		t.Fatalf("pack cache %s, want %s next to the database", src.cacheDir, want)
	}
	job := &app.Job{ID: "j1"}
	files, err := src.Bundles(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	if len(files.Inventories) != 1 {
		t.Fatalf("files %+v, want one inventory bundle for APP_INVENTORY_PATH", files)
	}
	again, err := src.Bundles(context.Background(), &app.Job{ID: "j2"})
	if err != nil || again.Playbooks != files.Playbooks || again.Inventories[0] != files.Inventories[0] {
		t.Fatalf("an unchanged tree packed again as %+v (%v), want the same bundles %+v", again, err, files)
	}
	for _, ref := range append(files.Inventories, files.Playbooks) {
		rc, size, err := src.Open(ref.Hash)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if size != ref.Size || int64(len(b)) != ref.Size || "sha256:"+hex.EncodeToString(sum[:]) != ref.Hash {
			t.Fatalf("Open(%s) gave %d bytes (said %d), want the %d bytes that hash to its name", ref.Hash, len(b), size, ref.Size)
		}
	}
	// The app's SSH keys never leave it: Pack leaves .ssh out.
	rc, _, _ := src.Open(files.Playbooks.Hash)
	defer rc.Close()
	dest := t.TempDir()
	if err := bundle.Unpack(context.Background(), rc, dest, bundle.UnpackLimits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dest, ".ssh")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the playbooks bundle holds .ssh (%v), want it left out", err)
	}
	if _, _, err := src.Open("sha256:" + strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "no longer in the app's bundle cache") {
		t.Fatalf("Open of an unknown bundle: %v, want an error saying it is not in the cache", err)
	}
}

func TestBundleSourceRefusesTooLargeDirectory(t *testing.T) {
	src, s := newTestSource(t, 1)
	writeTree(t, s.PlaybooksPath, map[string]string{"big.bin": strings.Repeat("x", 2<<20)})
	_, err := src.Bundles(context.Background(), &app.Job{ID: "j1"})
	var tl *bundle.TooLargeError
	if !errors.As(err, &tl) || !strings.Contains(err.Error(), "APP_PLAYBOOKS_PATH") || !strings.Contains(err.Error(), "RTE_FILES=local") {
		t.Fatalf("Bundles of a 2 MiB tree with RTE_FILES_MAX_MB=1: %v, want a too-large error saying to mount it on the RTE", err)
	}
	// The limit is read for every job: raised, the same tree goes.
	s.FilesMaxMB = 4
	if _, err := src.Bundles(context.Background(), &app.Job{ID: "j2"}); err != nil {
		t.Fatalf("Bundles after RTE_FILES_MAX_MB was raised to 4: %v", err)
	}
}

func TestNoPlaybooksPathNoSource(t *testing.T) {
	src, err := NewBundleSource(&settings.Settings{DB: filepath.Join(t.TempDir(), "app.db")}, zap.NewNop())
	if err != nil || src != nil || src.FilesConfig() != nil {
		t.Fatalf("NewBundleSource without APP_PLAYBOOKS_PATH = %v, %v; want no source, so the app sends no files", src, err)
	}
}

// A playbook file being written while a job's bundle is packed makes Pack fail with
// bundle.ChangedError; packSettled packs again, so the job goes out once the writing is done
// instead of ending with an error. Anything else fails at once.
func TestPackSettledTriesAgainWhileAFileChanges(t *testing.T) {
	defer func(p time.Duration) { packPause = p }(packPause)
	packPause = time.Millisecond
	tries := 0
	changing := func(failures int) func() (bundle.Packed, error) {
		return func() (bundle.Packed, error) {
			tries++
			if tries <= failures {
				return bundle.Packed{}, fmt.Errorf("pack /p: %w", &bundle.ChangedError{Path: "/p/ballast.bin", How: "shrank"})
			}
			return bundle.Packed{Name: "sha256:ok"}, nil
		}
	}
	if pb, err := packSettled(context.Background(), changing(3)); err != nil || pb.Name != "sha256:ok" || tries != 4 {
		t.Fatalf("packSettled = %+v, %v after %d tries; want the bundle after 4 tries", pb, err, tries)
	}
	tries = 0
	_, err := packSettled(context.Background(), changing(100))
	var changed *bundle.ChangedError
	if !errors.As(err, &changed) || tries != packTries {
		t.Fatalf("packSettled on a file that never settles = %v after %d tries; want ChangedError after %d", err, tries, packTries)
	}
	tries = 0
	other := errors.New("permission denied")
	if _, err := packSettled(context.Background(), func() (bundle.Packed, error) { tries++; return bundle.Packed{}, other }); !errors.Is(err, other) || tries != 1 {
		t.Fatalf("packSettled on another error = %v after %d tries; want it at once", err, tries)
	}
}
