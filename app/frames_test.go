package app_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// indexedBundles is memBundles with a frame index: each bundle cut into frames of 25 bytes.
type indexedBundles struct{ *memBundles }

func (m indexedBundles) Index(hash string) ([]protocol.BundleFrame, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.data[hash]
	var out []protocol.BundleFrame
	for off := 0; off < len(b); off += 25 {
		sum := sha256.Sum256(b[off:min(off+25, len(b))])
		out = append(out, protocol.BundleFrame{Size: int64(min(25, len(b)-off)), SHA256: hex.EncodeToString(sum[:])})
	}
	return out, nil
}

// TestBundleRangesSendsOnlyThem: asked for a bundle's frames, the app sends its index; asked
// then for ranges, it sends exactly those bytes at their offsets and bundle.end. A
// bundle.ranges out of turn is a bad message, and one past the bundle is refused by name.
func TestBundleRangesSendsOnlyThem(t *testing.T) {
	blob := randomBytes(9, 100)
	mem, refs := newMemBundles(blob)
	ta, x := transferApp(t, indexedBundles{mem})
	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	expectMsg[*protocol.JobStart](t, x)
	x.send(&protocol.JobAccepted{Job: j.ID})
	h := refs[0].Hash

	x.send(&protocol.BundleWant{Job: j.ID, Hashes: []string{h}, Frames: []string{h}})
	fr := expectMsg[*protocol.BundleFrames](t, x)
	if fr.Hash != h || fr.Size != 100 || len(fr.Frames) != 4 {
		t.Fatalf("bundle.frames %+v, want 4 frames of bundle %s, 100 bytes", *fr, h)
	}
	ranges := []protocol.ByteRange{{Offset: 10, Size: 20}, {Offset: 50, Size: 30}}
	x.send(&protocol.BundleRanges{Job: j.ID, Hash: h, Ranges: ranges})
	got := map[int64][]byte{}
	for {
		m, frame := x.next(t)
		if frame != nil {
			c, err := protocol.DecodeChunk(frame)
			if err != nil {
				t.Fatal(err)
			}
			got[int64(c.Offset)] = bytes.Clone(c.Payload)
			continue
		}
		end, ok := m.(*protocol.BundleEnd)
		if !ok || end.Hash != h || end.Size != 100 {
			t.Fatalf("app sent %T %+v, want bundle.end of %s with size 100", m, m, h)
		}
		break
	}
	if len(got) != 2 || !bytes.Equal(got[10], blob[10:30]) || !bytes.Equal(got[50], blob[50:80]) {
		t.Fatalf("chunks at %d offsets, want exactly the two ranges asked for", len(got))
	}

	// Answered once: the same ranges again are out of turn.
	x.send(&protocol.BundleRanges{Job: j.ID, Hash: h, Ranges: ranges})
	if e := expectMsg[*protocol.Error](t, x); e.Code != protocol.ErrUnexpected || e.Ref != h || !strings.Contains(e.Message, "did not send") {
		t.Fatalf("answer to bundle.ranges out of turn: %+v, want unexpected naming the bundle", *e)
	}

	x.send(&protocol.BundleWant{Job: j.ID, Hashes: []string{h}, Frames: []string{h}})
	expectMsg[*protocol.BundleFrames](t, x)
	x.send(&protocol.BundleRanges{Job: j.ID, Hash: h, Ranges: []protocol.ByteRange{{Offset: 90, Size: 20}}})
	miss := expectMsg[*protocol.BundleMissing](t, x)
	if miss.Hash != h || !strings.Contains(miss.Reason, "up to 110") || !strings.Contains(miss.Reason, "which has 100") {
		t.Fatalf("answer to a range past the bundle: %+v, want bundle.missing naming the bound", *miss)
	}
}
