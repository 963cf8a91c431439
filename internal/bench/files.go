package bench

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/rte-project/rte/cache/bundle"
	"github.com/rte-project/rte/protocol"
)

// FilesResult is what the RTE fetches for a directory of Files files after one of them
// changed, with the bundle.frames feature: the new bundle's frame index (the bundle.frames
// message as encoded) and the frames the old bundle did not hold, against the whole bundle
// that an app without the feature sends again.
type FilesResult struct {
	Files     int
	TreeBytes int64 // the files' bytes, uncompressed
	Whole     int64 // the new bundle, whole
	Index     int64 // the bundle.frames message
	Frames    int64 // the new bundle's frames the old one lacks
	NewFrames int   // how many
	AllFrames int
	FileAlone int64 // the changed file compressed alone with zstd's default level: the floor
}

// Files packs a generated playbook tree of n files with the real packer, appends a line to one
// file, packs again, and counts what the RTE would fetch. It is computed from the two bundles,
// exactly as the RTE decides (a frame is fetched unless a cached bundle holds one with its
// SHA-256); e2e's TestTransferByFrames shows the same over the real socket.
func Files(ctx context.Context, work string, n int) (FilesResult, error) {
	dir := filepath.Join(work, "files-tree")
	res := FilesResult{Files: n}
	rng := rand.New(rand.NewPCG(2026, uint64(n)))
	words := strings.Fields("name hosts tasks become when register loop item debug msg copy src dest mode owner group template service state started enabled package present notify handler vars default")
	var changed string
	for i := range n {
		path := filepath.Join(dir, "roles", fmt.Sprintf("role%03d", i/40), "tasks", fmt.Sprintf("file%04d.yml", i))
		if i == n/2 {
			changed = path
		}
		var b strings.Builder
		for line := range 40 + rng.IntN(80) {
			fmt.Fprintf(&b, "- name: task %d %s\n  ansible.builtin.%s: %s=%s\n", line, words[rng.IntN(len(words))],
				words[rng.IntN(len(words))], words[rng.IntN(len(words))], words[rng.IntN(len(words))])
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return res, err
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			return res, err
		}
		res.TreeBytes += int64(b.Len())
	}
	pack := func() ([]bundle.Frame, int64, error) {
		var buf bytes.Buffer
		if _, _, err := bundle.Pack(ctx, dir, &buf, bundle.PackOptions{}); err != nil {
			return nil, 0, err
		}
		frames, err := bundle.ScanFrames(bytes.NewReader(buf.Bytes()), 0)
		return frames, int64(buf.Len()), err
	}
	before, _, err := pack()
	if err != nil {
		return res, fmt.Errorf("pack the tree: %w", err)
	}
	body, err := os.ReadFile(changed)
	if err != nil {
		return res, err
	}
	body = append(body, "- ansible.builtin.debug: msg=changed\n"...)
	if err := os.WriteFile(changed, body, 0o644); err != nil {
		return res, err
	}
	after, size, err := pack()
	if err != nil {
		return res, fmt.Errorf("pack the changed tree: %w", err)
	}
	held := map[[32]byte]bool{}
	for _, f := range before {
		held[f.Hash] = true
	}
	index := protocol.BundleFrames{Hash: "sha256:" + strings.Repeat("0", 64), Size: size}
	for _, f := range after {
		index.Frames = append(index.Frames, protocol.BundleFrame{Size: f.Size, SHA256: hex.EncodeToString(f.Hash[:])})
		if !held[f.Hash] {
			res.Frames += f.Size
			res.NewFrames++
		}
	}
	msg, err := protocol.Encode(&index)
	if err != nil {
		return res, err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return res, err
	}
	defer enc.Close()
	res.Whole, res.Index, res.AllFrames = size, int64(len(msg)), len(after)
	res.FileAlone = int64(len(enc.EncodeAll(body, nil)))
	return res, os.RemoveAll(dir)
}
