package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// TestBadSettingsStopTheStart runs the binary with several bad settings at once: every problem
// is printed, the exit status is 2, and nothing listens.
func TestBadSettingsStopTheStart(t *testing.T) {
	port := freePort(t)
	out, code := runRTE(t, t.TempDir(), []string{
		fmt.Sprintf("PORT=%d", port), "RTE_TOKEN=short", "RTE_MODE=database", "DB_HOST=db.example",
		"ENCRYPTION_SECRET=x", "APP_URL=https://app.example",
	})
	if code != 2 {
		t.Fatalf("exit status %d, want 2; output:\n%s", code, out)
	}
	for _, want := range []string{"RTE_TOKEN", "RTE_MODE", "DB_HOST", "ENCRYPTION_SECRET", "database mode", "docs/migration-from-database-mode.md"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not mention %q:\n%s", want, out)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Fatal("something listens on the port after a refused start")
	}
}

func TestCheckConfigVersionFingerprint(t *testing.T) {
	dir := t.TempDir()
	env := []string{"RTE_TOKEN=" + testToken, "METRICS_TOKEN=metrics-token-0123456789", "RTE_JOIN_TOKEN=join-token-0123456789"}
	out, code := runRTE(t, dir, env, "check-config")
	if code != 0 || !strings.Contains(out, "settings: ok") {
		t.Fatalf("check-config exit %d:\n%s", code, out)
	}
	for _, secret := range []string{testToken, "metrics-token-0123456789", "join-token-0123456789"} {
		if strings.Contains(out, secret) {
			t.Fatalf("check-config printed a secret:\n%s", out)
		}
	}
	if !strings.Contains(out, protocol.TokenFingerprint(testToken)) {
		t.Fatalf("check-config does not show the token fingerprint:\n%s", out)
	}
	if out, code := runRTE(t, dir, []string{"RTE_TOKEN=short"}, "check-config"); code != 2 || !strings.Contains(out, "RTE_TOKEN") {
		t.Fatalf("check-config with a short token: exit %d:\n%s", code, out)
	}
	if out, code := runRTE(t, dir, nil, "version"); code != 0 || !strings.HasPrefix(out, "rte ") {
		t.Fatalf("version: exit %d: %q", code, out)
	}

	// fingerprint prints what the serving RTE logs for the same certificate.
	port := freePort(t)
	rte := startRTE(t, dir, port, append(env, "HTTPS=1")...)
	start := rte.WaitLog("rte starting", 30*time.Second)
	rte.Kill()
	out, code = runRTE(t, dir, env, "fingerprint")
	if code != 0 {
		t.Fatalf("fingerprint exit %d:\n%s", code, out)
	}
	for _, k := range []string{"certificate_fingerprint", "certificate_sha256", "token_fingerprint"} {
		want := fmt.Sprintf("%s: %v", k, start[k])
		if !strings.Contains(out, want) {
			t.Errorf("fingerprint output lacks %q:\n%s", want, out)
		}
	}
	if out, code := runRTE(t, dir, env, "fingerprint", "no-such.pem"); code == 0 || !strings.Contains(out, "no-such.pem") {
		t.Fatalf("fingerprint of a missing file: exit %d:\n%s", code, out)
	}
}

// TestProbesAndSignal checks the probes and the metrics token rule on the real binary, then
// that SIGTERM turns /ready 503 before the listener goes and the process exits 0.
func TestProbesAndSignal(t *testing.T) {
	port := freePort(t)
	rte := startRTE(t, t.TempDir(), port, "RTE_TOKEN="+testToken, "METRICS_TOKEN=metrics-token-0123456789",
		"RTE_DRAIN_SECONDS=2")
	for _, c := range []struct {
		path   string
		header []string
		want   int
	}{
		{"/live", nil, 200},
		{"/ready", nil, 200},
		{"/metrics", nil, 401},
		{"/metrics", []string{"Authorization", "Bearer wrong-token-0123456789"}, 401},
		{"/metrics", []string{"Authorization", "Bearer metrics-token-0123456789"}, 200},
		{"/rte/v1/socket", nil, 401},
		{"/rte/v1/socket", []string{"Authorization", "Bearer wrong-token-0123456789"}, 401},
		{"/nope", nil, 404},
	} {
		if code, body := rte.Probe(c.path, c.header...); code != c.want {
			t.Errorf("GET %s %v = %d, want %d (%s)", c.path, c.header, code, c.want, body)
		}
	}
	_, body := rte.Probe("/metrics", "Authorization", "Bearer metrics-token-0123456789")
	if !strings.Contains(body, `rte_auth_failures_total{endpoint="socket",reason="wrong"} 1`) {
		t.Errorf("auth failure not counted:\n%s", grepLines(body, "rte_auth"))
	}

	// An RTE without METRICS_TOKEN has no /metrics at all.
	bare := startRTE(t, t.TempDir(), freePort(t), "RTE_TOKEN="+testToken)
	if code, _ := bare.Probe("/metrics"); code != 404 {
		t.Errorf("/metrics without METRICS_TOKEN = %d, want 404", code)
	}

	// Hold a socket open so the drain has something to close, then SIGTERM.
	ws := dialRTE(t, rte, testToken)
	defer ws.Close()
	rte.Signal(syscall.SIGTERM)
	rte.WaitLog("stopping", 10*time.Second)
	if code := rte.Wait(30 * time.Second); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d, want 0", code)
	}
	if !strings.Contains(rte.Log(), "/ready answers 503") {
		t.Fatalf("the RTE did not turn /ready 503 before closing:\n%s", rte.Log())
	}
}

// dialRTE opens the socket as the app would, without pinning (plain ws:// here).
func dialRTE(t *testing.T, p *rteProc, token string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{protocol.Subprotocol}, HandshakeTimeout: 10 * time.Second,
		// A raw peer in a test: pinning is tested with the real dialer elsewhere.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	scheme := "ws"
	if p.TLS {
		scheme = "wss"
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+token)
	h.Set(protocol.HeaderAppNode, "test-node")
	ws, resp, err := d.Dial(fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, p.Port, protocol.SocketPath), h)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial the RTE: %v (status %d)", err, status)
	}
	return ws
}

// readMsg reads the next JSON message from a raw socket, within timeout.
func readMsg(t *testing.T, ws *websocket.Conn, timeout time.Duration) protocol.Message {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(timeout))
	_, data, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read from the RTE: %v", err)
	}
	m, err := protocol.Decode(data)
	if err != nil {
		t.Fatalf("the RTE sent a bad message %s: %v", data, err)
	}
	return m
}

func send(t *testing.T, ws *websocket.Conn, m protocol.Message) {
	t.Helper()
	b, err := protocol.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.WriteMessage(websocket.TextMessage, b); err != nil {
		t.Fatalf("write to the RTE: %v", err)
	}
}

// TestSocketReplacementBadMessagesKeepalive drives the real RTE's socket as a raw app: the
// handshake, a bad message answered and the socket kept, a second socket replacing the first
// with 4001, the bad-message budget closing with 1008, and keepalive death.
func TestSocketReplacementBadMessagesKeepalive(t *testing.T) {
	rte := startRTE(t, t.TempDir(), freePort(t), "RTE_TOKEN="+testToken,
		"RTE_PING_INTERVAL=100ms", "RTE_DEAD_AFTER=400ms")

	first := dialRTE(t, rte, testToken)
	defer first.Close()
	hello, ok := readMsg(t, first, 10*time.Second).(*protocol.Hello)
	if !ok || hello.Protocol != protocol.Version || hello.Mode != protocol.ModeInbound {
		t.Fatalf("first message is not a v1 inbound hello: %#v", hello)
	}
	send(t, first, &protocol.Welcome{Protocol: protocol.Version, Node: "test-node", Approved: true})
	// Answer pings by reading in the background from here on, as a live app does.
	if err := first.WriteMessage(websocket.TextMessage, []byte(`{"type":"job.explode","job":"j1"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		m := readMsg(t, first, 10*time.Second)
		if e, ok := m.(*protocol.Error); ok {
			if e.Code != protocol.ErrUnknownType || e.Ref != "j1" {
				t.Fatalf("error answer %+v, want unknown_type for j1", e)
			}
			break
		}
	}

	second := dialRTE(t, rte, testToken)
	defer second.Close()
	if code := readUntilClose(first, 10*time.Second); code != protocol.CloseReplaced {
		t.Fatalf("the replaced socket closed with %d, want %d", code, protocol.CloseReplaced)
	}

	// 101 bad messages within a minute close the socket with 1008.
	_ = readMsg(t, second, 10*time.Second) // hello
	send(t, second, &protocol.Welcome{Protocol: protocol.Version, Node: "test-node", Approved: true})
	for i := 0; i <= protocol.MaxBadMessages; i++ {
		if err := second.WriteMessage(websocket.TextMessage, []byte("not json")); err != nil {
			break
		}
	}
	if code := readUntilClose(second, 10*time.Second); code != protocol.ClosePolicyViolation {
		t.Fatalf("after %d bad messages the socket closed with %d, want %d", protocol.MaxBadMessages+1, code, protocol.ClosePolicyViolation)
	}

	// A peer that stops answering pings is dead after RTE_DEAD_AFTER: the RTE closes it.
	mark := rte.Mark()
	third := dialRTE(t, rte, testToken)
	defer third.Close()
	third.SetPingHandler(func(string) error { return nil }) // swallow pings: no pong goes back
	_ = readMsg(t, third, 10*time.Second)
	send(t, third, &protocol.Welcome{Protocol: protocol.Version, Node: "test-node", Approved: true})
	// The line that says so says nothing arrived for RTE_DEAD_AFTER.
	rte.WaitLogMatch(mark, "socket closed", 10*time.Second, func(l map[string]any) bool {
		why, _ := l["error"].(string)
		return strings.Contains(why, "nothing arrived")
	})
	_ = pinning.Pin{}
	_ = context.Background
}

// readUntilClose reads and discards messages until the socket closes, returning the close code.
func readUntilClose(ws *websocket.Conn, timeout time.Duration) int {
	_ = ws.SetReadDeadline(time.Now().Add(timeout))
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			if ce, ok := err.(*websocket.CloseError); ok {
				return ce.Code
			}
			return -1
		}
	}
}
