package session_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/cache"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/session"
)

const testOwner = "rte-test"

// cacheStore is the real bundle cache as the session sees it, adapted as internal/rte does.
type cacheStore struct{ *cache.Cache }

func (c cacheStore) Receive(hash string, size int64) (session.BundleReceiver, error) {
	in, err := c.Cache.Receive(hash, size)
	if err != nil {
		return nil, err
	}
	return in, nil
}

// bundleRig is a rig whose Manager fetches into a real cache in dir.
type bundleRig struct {
	*rig
	c   *cache.Cache
	dir string
}

func newBundleRig(t *testing.T) *bundleRig {
	t.Helper()
	dir := t.TempDir()
	c, err := cache.Open(cache.Config{Dir: dir, MaxBytes: 64 << 20, Owner: testOwner})
	if err != nil {
		t.Fatal(err)
	}
	return &bundleRig{rig: newRig(t, session.Config{Jobs: newJobs(7), Bundles: cacheStore{c}}), c: c, dir: dir}
}

// leftovers lists the files of half-received bundles in the cache.
func (r *bundleRig) leftovers(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(r.dir, "rtes", testOwner, "incoming"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// blob is a bundle's bytes (the session never unpacks, so any bytes do) and its reference.
type blob struct {
	data []byte
	ref  protocol.BundleRef
	raw  [32]byte
}

func newBlob(seed uint64, n int) blob {
	rng := rand.New(rand.NewPCG(seed, seed))
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	sum := sha256.Sum256(data)
	return blob{data: data, raw: sum, ref: protocol.BundleRef{Hash: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(n)}}
}

func (a *app) sendChunk(raw [32]byte, off int, payload []byte) {
	a.t.Helper()
	f, err := protocol.EncodeChunk(raw, uint64(off), payload)
	if err != nil {
		a.t.Fatal(err)
	}
	if err := a.ws.WriteMessage(websocket.BinaryMessage, f); err != nil {
		a.t.Fatalf("app write chunk: %v", err)
	}
}

// sendBundle sends b's bytes from..to in chunks of n bytes, last chunk first when reversed.
func (a *app) sendBundle(b blob, from, to, n int, reversed bool) {
	a.t.Helper()
	var offs []int
	for off := from; off < to; off += n {
		offs = append(offs, off)
	}
	if reversed {
		slices.Reverse(offs)
	}
	for _, off := range offs {
		a.sendChunk(b.raw, off, b.data[off:min(off+n, to)])
	}
}

// fetch runs Fetch in the background; its result arrives on the channel, which the test reads
// so that no goroutine outlives it.
func fetch(m *session.Manager, ctx context.Context, job string, refs ...protocol.BundleRef) <-chan error {
	done := make(chan error, 1)
	go func() { done <- m.Fetch(ctx, job, refs) }()
	return done
}

// probe sends a bundle.end nobody asked for and checks that the RTE's next message is the
// error answering it: nothing else (such as a second bundle.want) was queued before it.
func (a *app) probe() {
	a.t.Helper()
	hash := "sha256:" + strings.Repeat("f", 64)
	a.send(&protocol.BundleEnd{Hash: hash, Size: 1})
	if e := expect[*protocol.Error](a); e.Ref != hash || e.Code != protocol.ErrUnexpected {
		a.t.Fatalf("answer to a stray bundle.end: %+v, want unexpected with ref %s", *e, hash)
	}
}

func TestFetchAsksOnlyForMissingAndReceives(t *testing.T) {
	r := newBundleRig(t)
	have, b1, b2 := newBlob(1, 3000), newBlob(2, 2500), newBlob(3, 10)
	in, err := r.c.Receive(have.ref.Hash, have.ref.Size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.WriteAt(have.data, 0); err != nil {
		t.Fatal(err)
	}
	if err := in.Commit(have.ref.Size); err != nil {
		t.Fatal(err)
	}

	a := r.dial(t)
	a.handshake(approved)
	done := fetch(r.m, context.Background(), "j1", have.ref, b1.ref, b2.ref, b1.ref)
	want := expect[*protocol.BundleWant](a)
	wantHashes := []string{b1.ref.Hash, b2.ref.Hash}
	slices.Sort(wantHashes)
	if want.Job != "j1" || !slices.Equal(want.Hashes, wantHashes) {
		t.Fatalf("bundle.want %+v, want job j1 and only the missing %v", *want, wantHashes)
	}
	a.sendBundle(b1, 0, len(b1.data), 700, true) // out of order: hashed by reading back
	a.send(&protocol.BundleEnd{Hash: b1.ref.Hash, Size: b1.ref.Size})
	a.sendBundle(b2, 0, len(b2.data), 4, false)
	a.send(&protocol.BundleEnd{Hash: b2.ref.Hash, Size: b2.ref.Size})
	if err := <-done; err != nil {
		t.Fatalf("Fetch: %v, want nil after both bundles arrived", err)
	}
	for _, b := range []blob{b1, b2} {
		if !r.c.Has(b.ref.Hash) {
			t.Errorf("cache lacks %s after Fetch returned", b.ref.Hash)
		}
	}
	if l := r.leftovers(t); len(l) != 0 {
		t.Errorf("incoming holds %v after the bundles were committed, want nothing", l)
	}
	if got := metric(t, r.reg, "rte_bundles_received_total", map[string]string{"result": "ok"}); got != 2 {
		t.Errorf("rte_bundles_received_total{result=ok} = %v, want 2", got)
	}
	if got, want := metric(t, r.reg, "rte_bundle_received_bytes_total", nil), float64(len(b1.data)+len(b2.data)); got != want {
		t.Errorf("rte_bundle_received_bytes_total = %v, want %v", got, want)
	}
	// All present now: no want, no wait.
	if err := r.m.Fetch(context.Background(), "j2", []protocol.BundleRef{b1.ref, have.ref}); err != nil {
		t.Fatalf("Fetch of cached bundles: %v, want nil", err)
	}
	a.probe()
}

func TestFetchSharedBetweenJobsAsksOnce(t *testing.T) {
	r := newBundleRig(t)
	b := newBlob(4, 5000)
	a := r.dial(t)
	a.handshake(approved)
	first := fetch(r.m, context.Background(), "j1", b.ref)
	if want := expect[*protocol.BundleWant](a); want.Job != "j1" {
		t.Fatalf("bundle.want %+v, want j1's", *want)
	}
	second := fetch(r.m, context.Background(), "j2", b.ref)
	a.sendBundle(b, 0, len(b.data), 1000, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	for _, done := range []<-chan error{first, second} {
		if err := <-done; err != nil {
			t.Fatalf("Fetch: %v, want nil", err)
		}
	}
	a.probe() // j2 joined j1's transfer: no second bundle.want before the probe's answer
}

func TestFetchAsksAgainOnNewSocket(t *testing.T) {
	r := newBundleRig(t)
	b := newBlob(5, 8000)
	a := r.dial(t)
	a.handshake(approved)
	done := fetch(r.m, context.Background(), "j1", b.ref)
	expect[*protocol.BundleWant](a)
	a.sendBundle(b, 0, 3000, 1000, false)
	// A chunk round trip: the half transfer is written before the socket drops.
	a.probe()
	_ = a.ws.Close()

	a2 := r.dial(t)
	a2.handshake(approved)
	want := expect[*protocol.BundleWant](a2)
	if want.Job != "j1" || !slices.Equal(want.Hashes, []string{b.ref.Hash}) {
		t.Fatalf("bundle.want on the new socket %+v, want j1 asking for %s again", *want, b.ref.Hash)
	}
	a2.sendBundle(b, 0, len(b.data), 1000, false)
	a2.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	if err := <-done; err != nil {
		t.Fatalf("Fetch after the retry: %v, want nil", err)
	}
	if l := r.leftovers(t); len(l) != 0 {
		t.Errorf("incoming holds %v, want the first socket's half bundle gone", l)
	}
}

func TestFetchWaitsForWelcomeAndApproval(t *testing.T) {
	r := newBundleRig(t)
	b := newBlob(6, 100)
	done := fetch(r.m, context.Background(), "j1", b.ref)
	a := r.dial(t)
	w := approved
	w.Approved = false
	a.handshake(w)
	a.probe() // not approved: no bundle.want yet
	a.send(&protocol.Approved{})
	if want := expect[*protocol.BundleWant](a); want.Job != "j1" {
		t.Fatalf("bundle.want after approval %+v, want j1's", *want)
	}
	a.sendBundle(b, 0, len(b.data), 64, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	if err := <-done; err != nil {
		t.Fatalf("Fetch: %v, want nil", err)
	}
}

func TestFetchRefusesBadBundles(t *testing.T) {
	r := newBundleRig(t)
	a := r.dial(t)
	a.handshake(approved)
	for i, tc := range []struct {
		name string
		send func(b blob)
		says []string
	}{
		{"wrong bytes", func(b blob) {
			bad := bytes.Clone(b.data)
			bad[10] ^= 0xff
			a.sendBundle(blob{data: bad, raw: b.raw}, 0, len(bad), 512, false)
			a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
		}, []string{"discarded", "hash to", "not to its name"}},
		{"truncated", func(b blob) {
			a.sendBundle(b, 0, len(b.data)-100, 512, false)
			a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
		}, []string{"discarded", "truncated"}},
		{"end with another size", func(b blob) {
			a.sendBundle(b, 0, len(b.data), 512, false)
			a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size + 1})
		}, []string{"discarded", "bundle.end says"}},
		{"chunk past the size", func(b blob) {
			a.sendChunk(b.raw, len(b.data)-10, make([]byte, 20))
			a.sendBundle(b, 0, len(b.data), 512, false) // the rest is swallowed, not counted bad
			a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
		}, []string{"goes past its announced size"}},
		{"missing", func(b blob) {
			a.send(&protocol.BundleMissing{Hash: b.ref.Hash, Reason: "directory gone\x00 from the app"})
		}, []string{"the app has no bundle", "directory gone  from the app"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.t = t
			b := newBlob(uint64(100+i), 2000)
			done := fetch(r.m, context.Background(), "bad", b.ref)
			expect[*protocol.BundleWant](a)
			tc.send(b)
			err := <-done
			if err == nil {
				t.Fatal("Fetch: nil, want an error")
			}
			for _, s := range append(tc.says, b.ref.Hash) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Fetch error %q lacks %q", err, s)
				}
			}
			if r.c.Has(b.ref.Hash) {
				t.Errorf("cache holds the bad bundle %s", b.ref.Hash)
			}
			a.probe() // nothing of the bad bundle was answered as a bad message
			if l := r.leftovers(t); len(l) != 0 {
				t.Errorf("incoming holds %v after a bad bundle, want nothing", l)
			}
		})
	}
	if got := metric(t, r.reg, "rte_bad_messages_total", map[string]string{"code": protocol.ErrUnexpected}); got != 5 {
		t.Errorf("rte_bad_messages_total{code=unexpected} = %v, want only the 5 probes", got)
	}
	for result, want := range map[string]float64{"discarded": 4, "missing": 1, "ok": 0} {
		if got := metric(t, r.reg, "rte_bundles_received_total", map[string]string{"result": result}); got != want {
			t.Errorf("rte_bundles_received_total{result=%s} = %v, want %v", result, got, want)
		}
	}
}

func TestUnaskedChunksAreBadMessages(t *testing.T) {
	r := newBundleRig(t)
	a := r.dial(t)
	a.handshake(approved)
	b := newBlob(7, 10)
	a.sendChunk(b.raw, 0, b.data)
	if e := expect[*protocol.Error](a); e.Code != protocol.ErrUnexpected || e.Ref != b.ref.Hash || !strings.Contains(e.Message, "did not ask for") {
		t.Fatalf("answer to an unasked chunk: %+v, want unexpected naming %s", *e, b.ref.Hash)
	}
	if err := a.ws.WriteMessage(websocket.BinaryMessage, []byte{0x02, 1, 2}); err != nil {
		t.Fatal(err)
	}
	if e := expect[*protocol.Error](a); e.Code != protocol.ErrInvalid || !strings.Contains(e.Message, "shorter than") {
		t.Fatalf("answer to a short binary frame: %+v, want invalid", *e)
	}
	a.send(&protocol.BundleMissing{Hash: b.ref.Hash, Reason: "x"})
	if e := expect[*protocol.Error](a); e.Code != protocol.ErrUnexpected || e.Ref != b.ref.Hash {
		t.Fatalf("answer to an unasked bundle.missing: %+v, want unexpected", *e)
	}
	if got := metric(t, r.reg, "rte_bad_messages_total", map[string]string{"code": protocol.ErrUnexpected}); got != 2 {
		t.Errorf("rte_bad_messages_total{code=unexpected} = %v, want 2", got)
	}
	if got := metric(t, r.reg, "rte_bad_messages_total", map[string]string{"code": protocol.ErrInvalid}); got != 1 {
		t.Errorf("rte_bad_messages_total{code=invalid} = %v, want 1", got)
	}
}

func TestFetchCanceledKeepsReceiving(t *testing.T) {
	r := newBundleRig(t)
	b := newBlob(8, 3000)
	a := r.dial(t)
	a.handshake(approved)
	ctx, cancel := context.WithCancelCause(context.Background())
	done := fetch(r.m, ctx, "j1", b.ref)
	expect[*protocol.BundleWant](a)
	stopped := errors.New("job canceled by the app")
	cancel(stopped)
	if err := <-done; !errors.Is(err, stopped) || !strings.Contains(err.Error(), b.ref.Hash) {
		t.Fatalf("Fetch after cancel: %v, want the cause and the bundle named", err)
	}
	// The app sends it whole anyway: taken, not answered as bad, and kept for the next job.
	a.sendBundle(b, 0, len(b.data), 1000, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	a.probe()
	if !r.c.Has(b.ref.Hash) {
		t.Fatalf("cache lacks %s, which arrived after its job stopped waiting", b.ref.Hash)
	}
}

func TestFetchWithoutCache(t *testing.T) {
	r := newRig(t, session.Config{Jobs: newJobs(1)})
	err := r.m.Fetch(context.Background(), "j1", []protocol.BundleRef{newBlob(9, 1).ref})
	if err == nil || !strings.Contains(err.Error(), "RTE_FILES=local") {
		t.Fatalf("Fetch without Bundles: %v, want an error naming RTE_FILES=local", err)
	}
}

// TestRetryWaitsForTheFailedStreamToEnd fails a bundle with a chunk past its size; a second
// job that wants the same bundle while the app still streams the failed copy (here with bytes
// that do not match, as a confused app might send) is asked for only once that stream ended,
// so the two streams never mix.
func TestRetryWaitsForTheFailedStreamToEnd(t *testing.T) {
	r := newBundleRig(t)
	b := newBlob(10, 3000)
	a := r.dial(t)
	a.handshake(approved)
	first := fetch(r.m, context.Background(), "j1", b.ref)
	expect[*protocol.BundleWant](a)
	a.sendChunk(b.raw, len(b.data)-10, make([]byte, 20))
	if err := <-first; err == nil || !strings.Contains(err.Error(), "past its announced size") {
		t.Fatalf("Fetch after a chunk past the size: %v, want that error", err)
	}

	second := fetch(r.m, context.Background(), "j2", b.ref)
	eventually(t, "j2 waiting for the bundle", func() bool { return session.WaitingFor(r.m, b.ref.Hash) == 1 })
	garbage := bytes.Repeat([]byte{0xee}, len(b.data))
	a.sendBundle(blob{data: garbage, raw: b.raw}, 0, len(garbage), 1000, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})

	want := expect[*protocol.BundleWant](a)
	if want.Job != "j2" || !slices.Equal(want.Hashes, []string{b.ref.Hash}) {
		t.Fatalf("bundle.want %+v, want j2 asking for %s once the failed stream ended", *want, b.ref.Hash)
	}
	a.sendBundle(b, 0, len(b.data), 1000, false)
	a.send(&protocol.BundleEnd{Hash: b.ref.Hash, Size: b.ref.Size})
	if err := <-second; err != nil {
		t.Fatalf("Fetch of the retried bundle: %v, want nil", err)
	}
	if got := metric(t, r.reg, "rte_bad_messages_total", map[string]string{"code": protocol.ErrUnexpected}); got != 0 {
		t.Errorf("rte_bad_messages_total{code=unexpected} = %v, want 0: the failed stream's tail is not the app's fault to count", got)
	}
}
