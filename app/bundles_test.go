package app_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// memBundles is a BundleSource over bundles held in memory. Bundles answers files (or
// packErr); Open serves the bytes in data, reporting the size in size when set there.
type memBundles struct {
	mu      sync.Mutex
	files   *protocol.JobFiles
	packErr error
	data    map[string][]byte
	size    map[string]int64 // overrides what Open reports
	packed  []string         // job ids Bundles was called for
	opened  []string
}

func newMemBundles(blobs ...[]byte) (*memBundles, []protocol.BundleRef) {
	m := &memBundles{data: map[string][]byte{}, size: map[string]int64{}}
	var refs []protocol.BundleRef
	for _, b := range blobs {
		sum := sha256.Sum256(b)
		h := "sha256:" + hex.EncodeToString(sum[:])
		m.data[h] = b
		refs = append(refs, protocol.BundleRef{Hash: h, Size: int64(len(b))})
	}
	if len(refs) > 0 {
		m.files = &protocol.JobFiles{Playbooks: refs[0], Inventories: refs[1:]}
	}
	return m, refs
}

func (m *memBundles) Bundles(_ context.Context, j *app.Job) (*protocol.JobFiles, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.packed = append(m.packed, j.ID)
	return m.files, m.packErr
}

func (m *memBundles) Open(hash string) (io.ReadCloser, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.opened = append(m.opened, hash)
	b, ok := m.data[hash]
	if !ok {
		return nil, 0, errors.New("no such bundle here any more")
	}
	size, ok := m.size[hash]
	if !ok {
		size = int64(len(b))
	}
	return io.NopCloser(bytes.NewReader(b)), size, nil
}

func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0] = byte(seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// xferRTE is the RTE side of an inbound socket for a runner with RTE_FILES=transfer: it says
// hello, takes the welcome, and hands every frame the app sends to the test, binary ones too.
type xferRTE struct {
	t    testing.TB
	cert testCert
	name string
	ln   net.Listener
	srv  *http.Server
	wg   sync.WaitGroup

	mu     sync.Mutex
	ws     *websocket.Conn
	frames chan xferFrame
	ready  chan struct{} // one per welcome
}

type xferFrame struct {
	binary bool
	data   []byte
}

func startXfer(t testing.TB, name string) *xferRTE {
	t.Helper()
	x := &xferRTE{t: t, cert: newCert(t), name: name, frames: make(chan xferFrame, 256), ready: make(chan struct{}, 4)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	x.ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{x.cert.tls}, MinVersion: tls.VersionTLS12})
	x.srv = &http.Server{Handler: http.HandlerFunc(x.serve), ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		_ = x.srv.Serve(x.ln)
	}()
	t.Cleanup(func() {
		_ = x.srv.Close()
		x.mu.Lock()
		if x.ws != nil {
			_ = x.ws.Close()
		}
		x.mu.Unlock()
		x.wg.Wait()
	})
	return x
}

func (x *xferRTE) serve(w http.ResponseWriter, r *http.Request) {
	x.wg.Add(1)
	defer x.wg.Done()
	up := websocket.Upgrader{Subprotocols: []string{protocol.Subprotocol}}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	defer ws.Close()
	x.mu.Lock()
	x.ws = ws
	x.mu.Unlock()
	hello := protocol.Hello{Protocol: protocol.Version, Name: x.name, Version: "1.2.3", Instance: "xfer",
		Mode: protocol.ModeInbound, Files: protocol.FilesTransfer, MaxJobs: 10, Running: []string{},
		Spooled: []protocol.SpooledJob{}, TokenFingerprint: protocol.TokenFingerprint(testToken)}
	x.send(&hello)
	if _, _, err := ws.ReadMessage(); err != nil { // the welcome
		return
	}
	x.ready <- struct{}{}
	for {
		kind, data, err := ws.ReadMessage()
		if err != nil {
			return
		}
		x.frames <- xferFrame{binary: kind == websocket.BinaryMessage, data: data}
	}
}

func (x *xferRTE) send(m protocol.Message) {
	b, err := protocol.Encode(m)
	if err != nil {
		x.t.Error(err)
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.ws.WriteMessage(websocket.TextMessage, b); err != nil {
		x.t.Errorf("xfer RTE send %s: %v", m.Type(), err)
	}
}

// next returns the next frame from the app: a text message, or nil and a chunk's frame.
func (x *xferRTE) next(t testing.TB) (protocol.Message, []byte) {
	t.Helper()
	select {
	case f := <-x.frames:
		if f.binary {
			return nil, f.data
		}
		return decodeFrame(t, f.data), nil
	case <-time.After(waitLimit):
		t.Fatalf("no frame from the app within %s", waitLimit)
		return nil, nil
	}
}

func expectMsg[T protocol.Message](t testing.TB, x *xferRTE) T {
	t.Helper()
	m, chunk := x.next(t)
	v, ok := m.(T)
	if !ok {
		var want T
		t.Fatalf("app sent %T (chunk of %d bytes: %v), want %T", m, len(chunk), chunk != nil, want)
	}
	return v
}

// receiveBundles reads chunks until every bundle in want has its bundle.end, checking that each
// chunk is in bounds and comes before its bundle's end, and returns the bytes by hash.
func (x *xferRTE) receiveBundles(t testing.TB, want ...string) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	ended := map[string]bool{}
	for len(ended) < len(want) {
		m, frame := x.next(t)
		if frame != nil {
			c, err := protocol.DecodeChunk(frame)
			if err != nil {
				t.Fatalf("chunk from the app does not decode: %v", err)
			}
			h := c.HashName()
			if ended[h] {
				t.Fatalf("chunk of %s after its bundle.end", h)
			}
			if int(c.Offset) != len(got[h]) {
				t.Fatalf("chunk of %s at offset %d, want %d (in order, no gaps)", h, c.Offset, len(got[h]))
			}
			got[h] = append(got[h], c.Payload...)
			continue
		}
		switch m := m.(type) {
		case *protocol.BundleEnd:
			if m.Size != int64(len(got[m.Hash])) {
				t.Fatalf("bundle.end of %s says %d bytes, %d came", m.Hash, m.Size, len(got[m.Hash]))
			}
			ended[m.Hash] = true
		case *protocol.BundleMissing:
			t.Fatalf("bundle.missing %+v, want the bundle", *m)
		}
	}
	return got
}

// transferApp runs an App with src as its bundle source and one transfer-mode runner.
func transferApp(t *testing.T, src app.BundleSource) (*testApp, *xferRTE) {
	t.Helper()
	ta := runningApp(t, app.NewMemoryStore(), func(c *app.Config) {
		if src != nil {
			c.Files = src
		}
	})
	x := startXfer(t, "rte-x")
	if err := ta.AddRunner(context.Background(), &app.Runner{Name: x.name, URL: "https://" + x.ln.Addr().String(), Token: testToken, Certificate: x.cert.der}); err != nil {
		t.Fatal(err)
	}
	ta.start(t)
	recv(t, x.ready, "socket from the app")
	return ta, x
}

func TestTransferJobIsPackedAndItsBundlesServed(t *testing.T) {
	pb, inv := randomBytes(1, 2*protocol.MaxChunkPayload+12345), randomBytes(2, 777)
	src, refs := newMemBundles(pb, inv)
	ta, x := transferApp(t, src)

	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatalf("Submit to a transfer-mode runner with a bundle source: %v, want it queued", err)
	}
	start := expectMsg[*protocol.JobStart](t, x)
	if start.Files == nil || start.Files.Playbooks != refs[0] || len(start.Files.Inventories) != 1 || start.Files.Inventories[0] != refs[1] {
		t.Fatalf("job.start files %+v, want the source's bundles %v", start.Files, refs)
	}
	stored, err := ta.GetJob(context.Background(), j.ID)
	if err != nil || stored.Start.Files == nil || stored.Start.Files.Playbooks != refs[0] {
		t.Fatalf("stored job %+v (%v), want its files kept for a job.start sent again", stored, err)
	}
	x.send(&protocol.JobAccepted{Job: j.ID})
	x.send(&protocol.BundleWant{Job: j.ID, Hashes: []string{refs[0].Hash, refs[1].Hash}})
	got := x.receiveBundles(t, refs[0].Hash, refs[1].Hash)
	if !bytes.Equal(got[refs[0].Hash], pb) || !bytes.Equal(got[refs[1].Hash], inv) {
		t.Fatalf("bundles arrived with other bytes than the source's")
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.packed) != 1 {
		t.Errorf("Bundles called for %v, want once for the job", src.packed)
	}
}

func TestBundleWantRefusals(t *testing.T) {
	blob := randomBytes(3, 100)
	src, refs := newMemBundles(blob, randomBytes(4, 50))
	ta, x := transferApp(t, src)
	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	expectMsg[*protocol.JobStart](t, x)
	x.send(&protocol.JobAccepted{Job: j.ID})
	other := "sha256:" + strings.Repeat("0", 64)

	for _, tc := range []struct {
		name  string
		setup func()
		want  protocol.BundleWant
		says  string
	}{
		{"unknown job", nil, protocol.BundleWant{Job: "nobody", Hashes: []string{refs[0].Hash}}, "not a job this app gave"},
		{"not the job's bundle", nil, protocol.BundleWant{Job: j.ID, Hashes: []string{other}}, "not one of job"},
		{"source cannot open it", func() {
			src.mu.Lock()
			delete(src.data, refs[1].Hash)
			src.mu.Unlock()
		}, protocol.BundleWant{Job: j.ID, Hashes: []string{refs[1].Hash}}, "no such bundle here any more"},
		{"changed while sent", func() {
			src.mu.Lock()
			src.size[refs[0].Hash] = 99
			src.mu.Unlock()
		}, protocol.BundleWant{Job: j.ID, Hashes: []string{refs[0].Hash}}, "changed while the app sent it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			x.send(&tc.want)
			for {
				m, chunk := x.next(t)
				if chunk != nil {
					continue // what was read before the source's lie showed
				}
				miss, ok := m.(*protocol.BundleMissing)
				if !ok {
					t.Fatalf("app sent %T, want bundle.missing", m)
				}
				if miss.Hash != tc.want.Hashes[0] || !strings.Contains(miss.Reason, tc.says) {
					t.Fatalf("bundle.missing %+v, want hash %s and a reason saying %q", *miss, tc.want.Hashes[0], tc.says)
				}
				break
			}
		})
	}
}

func TestPackFailureEndsTheJob(t *testing.T) {
	src, _ := newMemBundles(randomBytes(5, 10))
	src.packErr = errors.New("directory /srv/playbooks holds 600.0 MiB of files, more than the 512.0 MiB that may be sent to an RTE (RTE_FILES_MAX_MB); mount it on the RTE instead (RTE_FILES=local)")
	ta, x := transferApp(t, src)
	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	end := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded))
	if end.Status != protocol.StatusError || !containsAll(end.Message, "not started", "RTE_FILES_MAX_MB", "RTE_FILES=local") {
		t.Fatalf("job %s ended %q: %q, want error saying to mount the directory on the RTE", j.ID, end.Status, end.Message)
	}
}

func TestBadSourceAnswerEndsTheJob(t *testing.T) {
	src, _ := newMemBundles(randomBytes(6, 10))
	src.files = &protocol.JobFiles{Playbooks: protocol.BundleRef{Hash: "md5:abc", Size: 3}}
	ta, x := transferApp(t, src)
	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	end := ta.waitJob(t, j.ID, "ended", inState(app.JobEnded))
	if end.Status != protocol.StatusError || !containsAll(end.Message, "bundle source named bad bundles", "files.playbooks.hash") {
		t.Fatalf("job ended %q: %q, want error naming the bad bundle field", end.Status, end.Message)
	}
}

func TestNoBundleSource(t *testing.T) {
	ta, x := transferApp(t, nil)
	// The runner's hello said transfer: a job without files has nothing to send it.
	if !testenv.Poll(waitLimit, func() bool { return ta.runner(t, x.name).Files == protocol.FilesTransfer }) {
		t.Fatal("the runner's file mode was never stored")
	}
	_, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err == nil || !strings.Contains(err.Error(), "RTE_FILES=local") {
		t.Fatalf("Submit without a bundle source: %v, want a refusal naming RTE_FILES=local", err)
	}
	h := "sha256:" + strings.Repeat("1", 64)
	x.send(&protocol.BundleWant{Job: "j1", Hashes: []string{h}})
	if m := expectMsg[*protocol.BundleMissing](t, x); m.Hash != h || !strings.Contains(m.Reason, "does not serve bundles") {
		t.Fatalf("bundle.missing %+v, want one saying the app serves no bundles", *m)
	}
}

// TestControlFramesOvertakeChunks asks for a large bundle and, while it streams, for a cancel:
// the job.cancel arrives before the bundle's end. The bundle is larger than what the loopback
// socket's buffers and the bulk queue hold together, so it cannot all be on its way already.
func TestControlFramesOvertakeChunks(t *testing.T) {
	const n = 32
	big := randomBytes(7, n*protocol.MaxChunkPayload)
	src, refs := newMemBundles(big)
	ta, x := transferApp(t, src)
	j, err := ta.Submit(context.Background(), app.JobRequest{Runner: x.name, JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		t.Fatal(err)
	}
	expectMsg[*protocol.JobStart](t, x)
	x.send(&protocol.JobAccepted{Job: j.ID})
	ta.waitJob(t, j.ID, "running", inState(app.JobRunning))
	x.send(&protocol.BundleWant{Job: j.ID, Hashes: []string{refs[0].Hash}})
	if _, chunk := x.next(t); chunk == nil {
		t.Fatal("first frame after bundle.want is not a chunk")
	}
	if err := ta.Cancel(context.Background(), j.ID); err != nil {
		t.Fatal(err)
	}
	chunks := 1
	for {
		m, chunk := x.next(t)
		if chunk != nil {
			chunks++
			continue
		}
		switch m.(type) {
		case *protocol.JobCancel:
			if chunks == n {
				t.Fatalf("job.cancel came after all %d chunks, want it ahead of the queued ones", chunks)
			}
			return
		case *protocol.BundleEnd:
			t.Fatalf("bundle.end before job.cancel (after %d chunks): the cancel waited behind the bundle", chunks)
		default:
			t.Fatalf("app sent %s, want chunks and job.cancel", fmt.Sprint(m.Type()))
		}
	}
}
