package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
	"github.com/rte-project/rte/server/socket"
)

const testToken = "e2e-token-0123456789abcdef"

// appHalf is the real app half on a real HTTP listener, with an in-memory store.
type appHalf struct{ *appSide }

func newAppHalf(t *testing.T) *appHalf {
	t.Helper()
	return &appHalf{startAppSide(t, served())}
}

// waitRunner waits until the app holds runner name in the wanted state.
func (a *appHalf) waitRunner(t *testing.T, name string, want app.State) *app.Runner {
	t.Helper()
	var last *app.Runner
	if !testenv.Poll(30*time.Second, func() bool {
		r, err := a.Store.GetRunner(context.Background(), name)
		last = r
		return err == nil && r.State == want
	}) {
		t.Fatalf("runner %q did not reach state %q within 30s; last seen %+v", name, want, last)
	}
	return last
}

func inboundEnv(a *appHalf, name string, port int, extra ...string) []string {
	return append([]string{
		"HTTPS=1", "RTE_TOKEN=" + testToken, "RTE_NAME=" + name,
		"APP_URL=" + a.URL, fmt.Sprintf("RTE_URL=https://127.0.0.1:%d", port),
		"METRICS_TOKEN=metrics-token-0123456789",
	}, extra...)
}

// TestInboundRegisterApproveAndPinnedDial is the test that matters for inbound mode: the real
// RTE registers with the real app half over HTTP, an admin approves after comparing the
// fingerprints the RTE logged with the ones the app received, the app dials the RTE over the
// pinned certificate and the handshake runs; the pin survives an RTE restart; and an impostor
// with another certificate at the same address is refused before it sees the token.
func TestInboundRegisterApproveAndPinnedDial(t *testing.T) {
	a := newAppHalf(t)
	port := freePort(t)
	dir := t.TempDir()
	rte := startRTE(t, dir, port, inboundEnv(a, "rte01", port)...)

	started := rte.WaitLog("rte starting", 30*time.Second)
	certFP, _ := started["certificate_fingerprint"].(string)
	tokenFP, _ := started["token_fingerprint"].(string)
	certSHA, _ := started["certificate_sha256"].(string)
	if certFP == "" || tokenFP == "" || len(certSHA) != 64 {
		t.Fatalf("start log lacks fingerprints: %v", started)
	}
	if strings.Contains(rte.Log(), testToken) {
		t.Fatal("the RTE logged its token")
	}

	// The admin's comparison: what the app received must be what the RTE logged.
	waiting := a.waitRunner(t, "rte01", app.StateWaiting)
	if got := protocol.CertificateFingerprint(waiting.PendingCertificate); got != certFP {
		t.Fatalf("app received certificate %s, the RTE logged %s", got, certFP)
	}
	if waiting.TokenFingerprint != tokenFP {
		t.Fatalf("app received token fingerprint %s, the RTE logged %s", waiting.TokenFingerprint, tokenFP)
	}
	if code, _ := rte.Probe("/ready"); code != 200 {
		t.Fatalf("/ready = %d while waiting for approval, want 200 (inbound serves before approval)", code)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.Approve(ctx, "rte01"); err != nil {
		t.Fatal(err)
	}
	peer, err := a.Connect(ctx, "rte01")
	if err != nil {
		t.Fatalf("pinned dial of an approved RTE: %v", err)
	}
	if peer.Hello.Name != "rte01" || peer.Hello.TokenFingerprint != tokenFP || peer.Hello.Mode != protocol.ModeInbound {
		t.Fatalf("hello = %+v", peer.Hello)
	}
	peerDone := runPeer(ctx, peer)
	rte.WaitLog("welcome", 30*time.Second)
	peer.Conn.Close(websocket.CloseNormalClosure, "test done")
	<-peerDone

	// Restart in the same directory: the same certificate is loaded, the registration is
	// answered approved at once, and the pinned dial still works.
	rte.Kill()
	rte = startRTE(t, dir, port, inboundEnv(a, "rte01", port)...)
	again := rte.WaitLog("rte starting", 30*time.Second)
	if again["certificate_sha256"] != certSHA {
		t.Fatalf("certificate changed across a restart: %v then %v", certSHA, again["certificate_sha256"])
	}
	rte.WaitLog("approved", 30*time.Second)
	peer, err = a.Connect(ctx, "rte01")
	if err != nil {
		t.Fatalf("pinned dial after a restart: %v", err)
	}
	peerDone = runPeer(ctx, peer)
	peer.Conn.Close(websocket.CloseNormalClosure, "test done")
	<-peerDone
	rte.Kill()

	// An impostor: another RTE, another certificate, the same address and token. The dialer
	// refuses it inside the TLS handshake, so it never receives an HTTP request (and so never
	// sees the token); its own registration is refused 409 and the runner waits again.
	impostor := startRTE(t, t.TempDir(), port, inboundEnv(a, "rte01", port)...)
	impStart := impostor.WaitLog("rte starting", 30*time.Second)
	impostor.WaitLog("registration refused", 30*time.Second)
	_, err = a.Connect(ctx, "rte01")
	var mismatch *pinning.MismatchError
	if err == nil {
		t.Fatal("the app dialled an RTE whose certificate is not the approved one")
	}
	if !errors.As(err, &mismatch) {
		// The impostor's 409 already put the runner back to waiting: Connect refuses to dial.
		r, _ := a.Store.GetRunner(ctx, "rte01")
		if r.State != app.StateWaiting {
			t.Fatalf("Connect to the impostor: %v, and the runner is %s", err, r.State)
		}
		if got := protocol.CertificateFingerprint(r.PendingCertificate); got != impStart["certificate_fingerprint"] {
			t.Fatalf("pending certificate %s, impostor logged %v", got, impStart["certificate_fingerprint"])
		}
		if got := protocol.CertificateFingerprint(r.Certificate); got != certFP {
			t.Fatalf("the approved certificate changed to %s without an admin", got)
		}
	} else if mismatch.Expected != certFP || mismatch.Presented != impStart["certificate_fingerprint"] {
		t.Fatalf("mismatch names %s/%s, want %s/%v", mismatch.Expected, mismatch.Presented, certFP, impStart["certificate_fingerprint"])
	}
	code, body := impostor.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
	if code != 200 || !strings.Contains(body, `rte_socket_connections_total{direction="inbound"} 0`) {
		t.Fatalf("the impostor accepted a socket or /metrics failed (%d):\n%s", code, grepLines(body, "rte_socket"))
	}
}

// TestPinnedDialerRefusesImpostor dials an impostor directly with the pin of the real RTE, so
// the refusal is the dialer's and not the registration's.
func TestPinnedDialerRefusesImpostor(t *testing.T) {
	a := newAppHalf(t)
	port := freePort(t)
	rte := startRTE(t, t.TempDir(), port, inboundEnv(a, "rte02", port)...)
	start := rte.WaitLog("rte starting", 30*time.Second)
	r := a.waitRunner(t, "rte02", app.StateWaiting)
	approvedDER := r.PendingCertificate
	rte.Kill()

	impostor := startRTE(t, t.TempDir(), port, "HTTPS=1", "RTE_TOKEN="+testToken, "RTE_NAME=rte02",
		"METRICS_TOKEN=metrics-token-0123456789")
	impStart := impostor.WaitLog("rte starting", 30*time.Second)

	d := &pinning.Dialer{Token: testToken, Node: "app-1", Timeout: 10 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := d.Dial(ctx, fmt.Sprintf("https://127.0.0.1:%d", port), pinning.Pin{DER: approvedDER})
	if err == nil {
		ws.Close()
		t.Fatal("the pinned dialer connected to an impostor")
	}
	var mismatch *pinning.MismatchError
	if !errors.As(err, &mismatch) {
		t.Fatalf("dial error %v, want *pinning.MismatchError", err)
	}
	if mismatch.Expected != start["certificate_fingerprint"] || mismatch.Presented != impStart["certificate_fingerprint"] {
		t.Fatalf("mismatch names expected %s presented %s; RTE logged %v, impostor %v",
			mismatch.Expected, mismatch.Presented, start["certificate_fingerprint"], impStart["certificate_fingerprint"])
	}
	if !strings.Contains(err.Error(), mismatch.Expected) || !strings.Contains(err.Error(), mismatch.Presented) {
		t.Fatalf("error text %q does not name both fingerprints", err)
	}
	_, body := impostor.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
	for _, want := range []string{`rte_socket_connections_total{direction="inbound"} 0`, `rte_auth_failures_total{endpoint="socket",reason="missing"} 0`, `rte_auth_failures_total{endpoint="socket",reason="wrong"} 0`} {
		if !strings.Contains(body, want) {
			t.Fatalf("impostor metrics lack %q: the dialer reached HTTP:\n%s", want, grepLines(body, "rte_"))
		}
	}
}

func runPeer(ctx context.Context, p *app.Peer) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		go func() { _ = p.Run(ctx) }()
		for {
			if _, err := p.Next(ctx); err != nil {
				return
			}
		}
	}()
	return done
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var _ = socket.CloseCode
