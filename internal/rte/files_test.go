package rte

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/config"
	"github.com/rte-project/rte/jobs"
	"github.com/rte-project/rte/protocol"
)

// cannedFetch plays the session: it "receives" bundles by committing bytes it holds.
type cannedFetch struct {
	src   *fileSource
	bytes map[string][]byte
}

func (c cannedFetch) Fetch(_ context.Context, _ string, refs []protocol.BundleRef) error {
	for _, r := range refs {
		if c.src.cache.Has(r.Hash) {
			continue
		}
		in, err := c.src.cache.Receive(r.Hash, r.Size)
		if err != nil {
			return err
		}
		if _, err := in.WriteAt(c.bytes[r.Hash], 0); err != nil {
			in.Abort()
			return err
		}
		if err := in.Commit(r.Size); err != nil {
			return err
		}
	}
	return nil
}

func transferSource(t *testing.T, cacheMB int) *fileSource {
	t.Helper()
	s := &config.Settings{Files: protocol.FilesTransfer, CachePath: t.TempDir(), CacheMB: cacheMB, CacheStaleAfter: time.Minute}
	f, err := newFileSource(s, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(s.CachePath, "rtes"); !strings.HasPrefix(f.workDir("local"), want) {
		t.Fatalf("transfer mode's job directories in %s, want them under %s so another RTE can sweep them", f.workDir("local"), want)
	}
	return f
}

func tarZstOf(t *testing.T, hdr *tar.Header, body string) ([]byte, protocol.BundleRef) {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	if err := tw.WriteHeader(hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(body)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	b := enc.EncodeAll(raw.Bytes(), nil)
	sum := sha256.Sum256(b)
	return b, protocol.BundleRef{Hash: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

func TestTransferValidate(t *testing.T) {
	f := transferSource(t, 1)
	huge := protocol.BundleRef{Hash: "sha256:" + strings.Repeat("a", 64), Size: 2 << 20}
	err := f.Validate(&protocol.JobStart{Job: "j1", Playbook: "site.yml", Files: &protocol.JobFiles{Playbooks: huge}})
	var r *jobs.Refusal
	if !errors.As(err, &r) || r.Code != protocol.RefusedFilesTooLarge || !strings.Contains(r.Message, "RTE_CACHE_MB") {
		t.Fatalf("Validate of a bundle larger than the cache: %v, want a files_too_large refusal naming RTE_CACHE_MB", err)
	}
	err = f.Validate(&protocol.JobStart{Job: "j1", Playbook: "site.yml"})
	if err == nil || errors.As(err, &r) || !strings.Contains(err.Error(), "RTE_FILES=transfer") {
		t.Fatalf("Validate of a job without files: %v, want an error (refused invalid) naming RTE_FILES=transfer", err)
	}
}

func TestTransferPrepareRunsAndDiscardsBadBundles(t *testing.T) {
	f := transferSource(t, 16)
	good, goodRef := tarZstOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: "site.yml", Size: 13, Mode: 0o644}, "- hosts: all\n")
	bad, badRef := tarZstOf(t, &tar.Header{Typeflag: tar.TypeLink, Name: "site.yml", Linkname: "/etc/passwd"}, "")
	f.fetch = cannedFetch{src: f, bytes: map[string][]byte{goodRef.Hash: good, badRef.Hash: bad}}

	ws, err := f.Prepare(context.Background(), &protocol.JobStart{Job: "ok", Playbook: "site.yml",
		Files: &protocol.JobFiles{Playbooks: goodRef}}, t.TempDir())
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	if filepath.Base(ws.Playbook) != "site.yml" || ws.Release == nil {
		t.Fatalf("workspace %+v, want site.yml in the unpacked project and a Release", ws)
	}
	ws.Release()

	_, err = f.Prepare(context.Background(), &protocol.JobStart{Job: "bad", Playbook: "site.yml",
		Files: &protocol.JobFiles{Playbooks: badRef}}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "hard links") || !strings.Contains(err.Error(), badRef.Hash) {
		t.Fatalf("Prepare of a bundle with a hard link: %v, want an error naming the bundle and the rule", err)
	}
	if f.cache.Has(badRef.Hash) {
		t.Fatal("the bundle that never unpacks stays in the cache, want it discarded")
	}
	if !f.cache.Has(goodRef.Hash) {
		t.Fatal("the good bundle left the cache")
	}
}

func TestLocalModeKeepsWorkPath(t *testing.T) {
	f, err := newFileSource(&config.Settings{Files: protocol.FilesLocal, AnsiblePath: t.TempDir(), RepoPath: t.TempDir()}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if f.workDir("/work/jobs") != "/work/jobs" || f.bundles() != nil {
		t.Fatalf("local mode: work dir %s, bundle store %v; want RTE_WORK_PATH's and none", f.workDir("/work/jobs"), f.bundles())
	}
}
