package app_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// connect dials and fails the test on error; the peer's socket is closed at cleanup.
func connect(t *testing.T, ta *testApp, name string) *app.Peer {
	t.Helper()
	peer, err := ta.Connect(context.Background(), name)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { peer.Conn.Close(websocket.CloseNormalClosure, "test over") })
	return peer
}

// wantWelcome reads the app's first frame on the fake RTE and checks it is the welcome.
func wantWelcome(t *testing.T, rte *fakeRTE, maxJobs int) {
	t.Helper()
	m := decodeFrame(t, rte.frame(t))
	w, ok := m.(*protocol.Welcome)
	want := protocol.Welcome{Protocol: protocol.Version, Node: testNode, Approved: true, MaxJobs: maxJobs}
	if !ok || w.Protocol != want.Protocol || w.Node != want.Node || w.Approved != want.Approved || w.MaxJobs != want.MaxJobs {
		t.Fatalf("first frame from the app is %#v, want %+v", m, want)
	}
}

// wantAuth checks that the newest request the fake RTE saw carried the token and the node.
func wantAuth(t *testing.T, rte *fakeRTE) {
	t.Helper()
	seen := rte.seen()
	if len(seen) == 0 {
		t.Fatal("the RTE saw no request")
	}
	h := seen[len(seen)-1]
	if h.Get("Authorization") != "Bearer "+testToken || h.Get(protocol.HeaderAppNode) != testNode {
		t.Errorf("the RTE saw X-App-Node %q and the right token %v, want %q and true",
			h.Get(protocol.HeaderAppNode), h.Get("Authorization") == "Bearer "+testToken, testNode)
	}
}

// TestConnectPinsTheApprovedCertificate is the inbound story end to end on the app's side:
// register, approve, dial; then the RTE comes back on the same port with another certificate.
func TestConnectPinsTheApprovedCertificate(t *testing.T) {
	ta := newTestApp(t, nil)
	ctx := context.Background()
	cert1, cert2 := newCert(t), newCert(t)
	rte1 := startFakeRTE(t, "127.0.0.1:0", &cert1, helloFrame(t, 1))

	// Register the way the RTE does, with the project's own registrar.
	reg := pinning.Registrar{
		Client: ta.srv.Client(),
		AppURL: ta.srv.URL,
		Request: protocol.RegisterRequest{Name: "rte01", URL: rte1.url(), Token: testToken,
			Certificate: cert1.pem, Version: "1.2.3", MaxJobs: 10},
	}
	if err := reg.Run(ctx); err != nil {
		t.Fatalf("registration: %v", err)
	}
	if _, err := ta.Connect(ctx, "rte01"); err == nil || !strings.Contains(err.Error(), "not approved") {
		t.Fatalf("connect before approval got %v, want a refusal saying it is not approved", err)
	}
	if n := len(rte1.seen()); n != 0 {
		t.Fatalf("the app dialled a runner waiting for approval (%d requests)", n)
	}

	if err := ta.Approve(ctx, "rte01"); err != nil {
		t.Fatal(err)
	}
	r := ta.runner(t, "rte01")
	r.MaxJobs = 3 // the runner page's override travels in welcome
	if err := ta.store.PutRunner(ctx, r); err != nil {
		t.Fatal(err)
	}
	ta.clock.Advance(time.Minute)
	peer := connect(t, ta, "rte01")
	wantWelcome(t, rte1, 3)
	wantAuth(t, rte1)
	if peer.Runner != "rte01" || peer.Hello.Name != "rte01" || peer.Hello.AnsibleVersion != "2.14.18" || peer.Conn.Subprotocol() != protocol.Subprotocol {
		t.Errorf("peer is %q with hello %+v on subprotocol %q, want rte01, its hello, rte.v1", peer.Runner, peer.Hello, peer.Conn.Subprotocol())
	}
	if got := peer.Hello.Images; len(got) != 2 || got[0] != "rte:dev" || got[1] != "registry.example/ee-*:*" {
		t.Errorf("hello images %q, want the runner's default and its allowlist", got)
	}
	if r := ta.runner(t, "rte01"); !r.LastSeen.Equal(ta.clock.Now()) || r.Files != protocol.FilesTransfer {
		t.Errorf("runner last seen %s with files %q, want now and transfer", r.LastSeen, r.Files)
	}

	// The peer's reader answers bad frames and hands out only messages an RTE sends.
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- peer.Run(runCtx) }()
	rte1.send(t, "not json")
	rte1.send(t, `{"type":"ack","job":"j1","seq":1}`)
	rte1.send(t, `{"type":"capacity","running":1,"max_jobs":10,"draining":false}`)
	m, err := peer.Next(ctx)
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	if c, ok := m.(*protocol.Capacity); !ok || *c != (protocol.Capacity{Running: 1, MaxJobs: 10}) {
		t.Fatalf("next returned %#v, want the capacity message", m)
	}
	for _, code := range []string{protocol.ErrBadJSON, protocol.ErrUnexpected} {
		e, ok := decodeFrame(t, rte1.frame(t)).(*protocol.Error)
		if !ok || e.Code != code {
			t.Fatalf("the RTE got %#v, want an error %s", e, code)
		}
	}
	if err := peer.Send(ctx, protocol.Settings{MaxJobs: 4}); err != nil {
		t.Fatal(err)
	}
	if s, ok := decodeFrame(t, rte1.frame(t)).(*protocol.Settings); !ok || s.MaxJobs != 4 {
		t.Fatalf("the RTE got %#v, want settings max_jobs 4", s)
	}
	stopRun()
	<-runDone
	if code := rte1.closeCode(t); code != websocket.CloseGoingAway {
		t.Errorf("the RTE saw close %d when the app stopped, want %d", code, websocket.CloseGoingAway)
	}
	if _, err := peer.Next(ctx); err == nil {
		t.Error("next on a closed socket returned no error")
	}

	// The RTE restarts on the same port with a different certificate.
	rte1.Close()
	rte2 := startFakeRTE(t, rte1.addr, &cert2, helloFrame(t, 1))
	_, err = ta.Connect(ctx, "rte01")
	var mismatch *pinning.MismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("connect to a changed certificate got %v, want a *pinning.MismatchError", err)
	}
	for _, fp := range []string{protocol.CertificateFingerprint(cert1.der), protocol.CertificateFingerprint(cert2.der)} {
		if !strings.Contains(err.Error(), fp) {
			t.Errorf("mismatch error %q does not name fingerprint %s", err, fp)
		}
	}
	if n := len(rte2.seen()); n != 0 {
		t.Fatalf("the RTE with the changed certificate saw %d HTTP requests, want 0: the token must not leave the app", n)
	}
	r = ta.runner(t, "rte01")
	if r.State != app.StateWaiting || !bytes.Equal(r.Certificate, cert1.der) || !bytes.Equal(r.PendingCertificate, cert2.der) {
		t.Fatalf("after the mismatch the runner is %s, old pin kept %v, new pending %v; want waiting with both",
			r.State, bytes.Equal(r.Certificate, cert1.der), bytes.Equal(r.PendingCertificate, cert2.der))
	}
	if _, err := ta.Connect(ctx, "rte01"); err == nil || len(rte2.seen()) != 0 {
		t.Fatalf("a second connect got %v with %d requests at the RTE, want a refusal without dialling", err, len(rte2.seen()))
	}

	if err := ta.Approve(ctx, "rte01"); err != nil {
		t.Fatal(err)
	}
	connect(t, ta, "rte01")
	wantWelcome(t, rte2, 3)
	wantAuth(t, rte2)
}

func TestConnectRunnerAddedByHand(t *testing.T) {
	ctx := context.Background()
	cert, other := newCert(t), newCert(t)
	add := func(t *testing.T, ta *testApp, url, sha string) {
		t.Helper()
		if err := ta.AddRunner(ctx, &app.Runner{Name: "rte01", URL: url, Token: testToken, CertificateSHA256: sha}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("fingerprint pins the first matching certificate", func(t *testing.T) {
		ta := newTestApp(t, nil)
		rte := startFakeRTE(t, "127.0.0.1:0", &cert, helloFrame(t, 1))
		// As an operator pastes it: upper case with colons.
		sha := strings.ToUpper(protocol.CertificateSHA256(cert.der))
		var colons []string
		for i := 0; i < len(sha); i += 2 {
			colons = append(colons, sha[i:i+2])
		}
		add(t, ta, rte.url(), strings.Join(colons, ":"))
		connect(t, ta, "rte01")
		wantWelcome(t, rte, 0)
		if r := ta.runner(t, "rte01"); !bytes.Equal(r.Certificate, cert.der) || r.State != app.StateApproved {
			t.Errorf("runner is %s pinned %v, want approved with the certificate pinned", r.State, bytes.Equal(r.Certificate, cert.der))
		}
	})

	t.Run("no pin: trust on first use waits for approval", func(t *testing.T) {
		ta := newTestApp(t, nil)
		rte := startFakeRTE(t, "127.0.0.1:0", &cert, helloFrame(t, 1))
		add(t, ta, rte.url(), "")
		_, err := ta.Connect(ctx, "rte01")
		var unpinned *pinning.UnpinnedError
		if !errors.As(err, &unpinned) || !strings.Contains(err.Error(), "trust on first use") || !strings.Contains(err.Error(), protocol.CertificateFingerprint(cert.der)) {
			t.Fatalf("first connect got %v, want a *pinning.UnpinnedError naming the fingerprint and trust on first use", err)
		}
		if n := len(rte.seen()); n != 0 {
			t.Fatalf("the unpinned RTE saw %d requests, want 0", n)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateWaiting || !bytes.Equal(r.PendingCertificate, cert.der) {
			t.Fatalf("runner is %s, pending %v; want waiting with the presented certificate", r.State, bytes.Equal(r.PendingCertificate, cert.der))
		}
		if err := ta.Approve(ctx, "rte01"); err != nil {
			t.Fatal(err)
		}
		connect(t, ta, "rte01")
		wantWelcome(t, rte, 0)
	})

	t.Run("other fingerprint is refused", func(t *testing.T) {
		ta := newTestApp(t, nil)
		rte := startFakeRTE(t, "127.0.0.1:0", &cert, helloFrame(t, 1))
		add(t, ta, rte.url(), protocol.CertificateSHA256(other.der))
		_, err := ta.Connect(ctx, "rte01")
		var mismatch *pinning.MismatchError
		if !errors.As(err, &mismatch) {
			t.Fatalf("got %v, want a *pinning.MismatchError", err)
		}
		if r := ta.runner(t, "rte01"); r.State != app.StateWaiting || !bytes.Equal(r.PendingCertificate, cert.der) || len(rte.seen()) != 0 {
			t.Errorf("runner is %s with the presented certificate pending %v and %d requests at the RTE; want waiting, pending, none",
				r.State, bytes.Equal(r.PendingCertificate, cert.der), len(rte.seen()))
		}
	})

	t.Run("plain http", func(t *testing.T) {
		ta := newTestApp(t, nil)
		rte := startFakeRTE(t, "127.0.0.1:0", nil, helloFrame(t, 1))
		add(t, ta, rte.url(), "")
		connect(t, ta, "rte01")
		wantWelcome(t, rte, 0)
		wantAuth(t, rte)
	})
}

func TestConnectClosesOtherProtocolVersions(t *testing.T) {
	for _, v := range []int{2, 0} {
		ta := newTestApp(t, nil)
		rte := startFakeRTE(t, "127.0.0.1:0", nil, helloFrame(t, v))
		if err := ta.AddRunner(context.Background(), &app.Runner{Name: "rte01", URL: rte.url(), Token: testToken}); err != nil {
			t.Fatal(err)
		}
		_, err := ta.Connect(context.Background(), "rte01")
		if err == nil || !strings.Contains(err.Error(), "speaks protocol") {
			t.Errorf("hello with protocol %d: connect got %v, want an error naming the protocol", v, err)
		}
		if code := rte.closeCode(t); code != protocol.CloseUnsupportedProtoV {
			t.Errorf("hello with protocol %d: the RTE saw close %d, want %d", v, code, protocol.CloseUnsupportedProtoV)
		}
	}
}

func TestConnectHandshakeFailures(t *testing.T) {
	tests := []struct {
		name      string
		hello     string // "" sends none
		token     string // the token the RTE expects
		says      string
		closeCode int // what the RTE must see; 0 when the app never upgraded
	}{
		{"no hello", "", testToken, "no hello within", 0},
		{"first message is not hello", `{"type":"capacity","running":0,"max_jobs":1,"draining":false}`, testToken, "not hello", protocol.CloseProtocolError},
		{"hello without a name", `{"type":"hello","protocol":1,"version":"1","mode":"inbound","files":"transfer","max_jobs":1}`, testToken, "bad hello", protocol.CloseProtocolError},
		{"token the RTE does not know", "", "the-runner-has-another-token", "refused the token (401)", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := newTestApp(t, func(c *app.Config) { c.HelloTimeout = 300 * time.Millisecond })
			var hello []byte
			if tt.hello != "" {
				hello = []byte(tt.hello)
			}
			rte := startFakeRTE(t, "127.0.0.1:0", nil, hello, func(c *apptest.Config) { c.Token = tt.token })
			if err := ta.AddRunner(context.Background(), &app.Runner{Name: "rte01", URL: rte.url(), Token: testToken}); err != nil {
				t.Fatal(err)
			}
			_, err := ta.Connect(context.Background(), "rte01")
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("connect got %v, want an error saying %q", err, tt.says)
			}
			if tt.closeCode != 0 {
				if code := rte.closeCode(t); code != tt.closeCode {
					t.Errorf("the RTE saw close %d, want %d", code, tt.closeCode)
				}
			}
			if r := ta.runner(t, "rte01"); r.State != app.StateApproved {
				t.Errorf("a failed handshake left the runner %s, want approved: only a certificate puts it back to waiting", r.State)
			}
		})
	}
}

func TestConnectCancelledWhileWaitingForHello(t *testing.T) {
	ta := newTestApp(t, nil) // HelloTimeout 5s: the cancel must end the wait, not the timeout
	rte := startFakeRTE(t, "127.0.0.1:0", nil, nil)
	if err := ta.AddRunner(context.Background(), &app.Runner{Name: "rte01", URL: rte.url(), Token: testToken}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := ta.Connect(ctx, "rte01")
		done <- err
	}()
	select {
	case <-rte.upgrades:
	case <-time.After(10 * time.Second):
		t.Fatal("the app never upgraded the socket")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled connect got %v, want context.Canceled", err)
	}
}

func TestConnectRefusals(t *testing.T) {
	ta := newTestApp(t, nil)
	ctx := context.Background()
	if _, err := ta.Connect(ctx, "nobody"); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("connect to an unknown runner got %v, want ErrNotFound", err)
	}
	if err := ta.AddRunner(ctx, &app.Runner{Name: "out", Mode: protocol.ModeOutbound, Token: testToken}); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Connect(ctx, "out"); err == nil || !strings.Contains(err.Error(), "dials the app itself") {
		t.Errorf("connect to an outbound runner got %v, want a refusal saying it dials the app", err)
	}
}
