package cache_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/internal/testenv"
)

// clock is a settable clock shared by the Cache values of a test.
type clock = testenv.Clock

// newClock starts at the real time, so that uses recorded by another process (which has only
// the real clock) and by the test fall in one timeline.
func newClock() *clock { return testenv.NewClock(time.Now()) }

func openCache(t testing.TB, dir, owner string, maxBytes int64, clk *clock) *cache.Cache {
	t.Helper()
	cfg := cache.Config{Dir: dir, MaxBytes: maxBytes, Owner: owner, Logger: zaptest.NewLogger(t)}
	if clk != nil {
		cfg.Now = clk.Now
	}
	c, err := cache.Open(cfg)
	if err != nil {
		t.Fatalf("Open(%s as %s): %v", dir, owner, err)
	}
	return c
}

// files is a tree to pack: path to content.
type files map[string]string

// makeBundle packs a tree of files and returns the bundle's bytes and name.
func makeBundle(t testing.TB, tree files) ([]byte, string) {
	t.Helper()
	root := t.TempDir()
	for p, data := range tree {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	name, _, err := bundle.Pack(context.Background(), root, &buf, bundle.PackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), name
}

// randomBundle packs size bytes of random data, so bundles of one size have nearly one size.
func randomBundle(t testing.TB, size int) ([]byte, string) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	return makeBundle(t, files{"data": string(b)})
}

// receive sends data to c in chunks, in order, and commits it.
func receive(t testing.TB, c *cache.Cache, hash string, data []byte, chunk int) {
	t.Helper()
	if err := receiveErr(c, hash, data, chunk); err != nil {
		t.Fatalf("receive %s: %v", hash, err)
	}
}

func receiveErr(c *cache.Cache, hash string, data []byte, chunk int) error {
	in, err := c.Receive(hash, int64(len(data)))
	if err != nil {
		return err
	}
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		if _, err := in.WriteAt(data[off:end], int64(off)); err != nil {
			in.Abort()
			return err
		}
	}
	return in.Commit(int64(len(data)))
}

// dirNames lists a directory's entries, or fails the test.
func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// temps lists the partial files every RTE of a cache directory holds.
func temps(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "rtes", "*", "incoming", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

func hashOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
