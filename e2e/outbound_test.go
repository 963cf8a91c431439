package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/sqlitestore"
	"github.com/rte-project/rte/internal/testenv"
	"github.com/rte-project/rte/protocol"
)

// outboundApp is the real app half (SQLite store, Run loop) that outbound RTEs dial. Its
// handler counts the sockets each runner name asks for, to catch an RTE that dials too often.
type outboundApp struct {
	t     *testing.T
	App   *app.App
	Store app.Store
	side  *appSide

	mu    sync.Mutex
	dials map[string]int
}

// newOutboundApp opens the store at dbPath (a new one when empty) and runs the app on it;
// edits change its config first (another node name, a seed).
func newOutboundApp(t *testing.T, dbPath string, edits ...func(*app.Config)) *outboundApp {
	t.Helper()
	side := startAppSide(t, onSQLite(dbPath), running(), withAppConfig(func(c *app.Config) {
		c.JoinToken = joinToken
		c.PollInterval = 100 * time.Millisecond
	}), withAppConfig(edits...))
	oa := &outboundApp{t: t, App: side.App, Store: side.Store, side: side, dials: map[string]int{}}
	t.Cleanup(oa.Stop)
	return oa
}

// Stop ends Run, which closes every outbound socket, and closes the store. Safe to call twice.
func (oa *outboundApp) Stop() {
	oa.side.Stop()
	_ = oa.Store.(*sqlitestore.Store).Close()
}

func (oa *outboundApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == protocol.OutboundSocketPath {
		oa.mu.Lock()
		oa.dials[r.Header.Get(protocol.HeaderRTEName)]++
		oa.mu.Unlock()
	}
	oa.App.Handler().ServeHTTP(w, r)
}

func (oa *outboundApp) dialsOf(name string) int {
	oa.mu.Lock()
	defer oa.mu.Unlock()
	return oa.dials[name]
}

// waitRunner waits until the runner is stored in state.
func (oa *outboundApp) waitRunner(name string, state app.State) *app.Runner {
	oa.t.Helper()
	var r *app.Runner
	if !testenv.Poll(30*time.Second, func() bool {
		got, err := oa.Store.GetRunner(context.Background(), name)
		r = got
		return err == nil && got.State == state
	}) {
		oa.t.Fatalf("runner %q not %s within 30s", name, state)
	}
	return r
}

// rig gives the jobRig helpers (submit, waitEnd, story) over this app and an RTE.
func (oa *outboundApp) rig(rte *rteProc, name string) *jobRig {
	return &jobRig{t: oa.t, App: oa.App, Store: oa.Store, RTE: rte, Name: name}
}

// outboundEnv is an outbound RTE named name, with a token of its own, running playbooks from
// e2e/testdata.
func outboundEnv(appURL, name string, extra ...string) []string {
	testdata, _ := filepath.Abs("testdata")
	return append([]string{
		"RTE_MODE=outbound", "APP_URL=" + appURL, "RTE_NAME=" + name, "RTE_TOKEN=" + outboundToken(name),
		"RTE_FILES=local", "ANSIBLE_PATH=" + filepath.Join(testdata, "playbooks"),
		"REPO_PATH=" + filepath.Join(testdata, "inventory"), "RTE_DRAIN_SECONDS=2",
	}, extra...)
}

func outboundToken(name string) string { return "e2e-outbound-token-" + name }

// waitReady polls /ready until it answers 200.
func waitReady(t *testing.T, rte *rteProc) {
	t.Helper()
	var code int
	var body string
	if !testenv.Poll(30*time.Second, func() bool { code, body = rte.Probe("/ready"); return code == http.StatusOK }) {
		t.Fatalf("/ready still %d %q after 30s", code, body)
	}
}

func welcomedWith(approved bool) func(map[string]any) bool {
	return func(l map[string]any) bool { return l["approved"] == approved }
}

// noRace fails the test when a race-enabled RTE reported a data race: the process carries on
// after one, so only its output tells.
func noRace(t *testing.T, rtes ...*rteProc) {
	t.Helper()
	for _, r := range rtes {
		if log := r.Log(); strings.Contains(log, "DATA RACE") {
			t.Fatalf("the RTE on port %d reported a data race:\n%s", r.Port, log)
		}
	}
}

func countLog(rte *rteProc, msg string) int {
	n := 0
	for _, l := range rte.Lines(0) {
		if s, _ := l["msg"].(string); strings.Contains(s, msg) {
			n++
		}
	}
	return n
}

// TestOutboundJoinApproveAndRun is the test that matters for outbound mode: the real RTE dials
// the real app half, is not ready until the app welcomes it, waits on its open socket for an
// admin, is approved without reconnecting, and runs a real playbook over that socket.
func TestOutboundJoinApproveAndRun(t *testing.T) {
	oa := newOutboundApp(t, "")
	// The listener is bound but serves nothing yet: the RTE's dial hangs, as against an app
	// that is still starting.
	srv := httptest.NewUnstartedServer(oa)
	t.Cleanup(srv.Close)
	const name = "rte-out-1"
	rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv("http://"+srv.Listener.Addr().String(), name)...)
	if code, body := rte.Probe("/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "app") {
		t.Fatalf("/ready before the app answered: %d %q, want 503 naming the app", code, body)
	}
	srv.Start()

	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(false))
	r := oa.waitRunner(name, app.StateWaiting)
	if r.Mode != protocol.ModeOutbound || r.TokenFingerprint != protocol.TokenFingerprint(outboundToken(name)) {
		t.Fatalf("runner %+v, want outbound with the RTE's token fingerprint", r)
	}
	started := rte.WaitLog("rte starting", time.Second)
	if fp, _ := started["token_fingerprint"].(string); fp != r.TokenFingerprint {
		t.Fatalf("the RTE logged token fingerprint %q, the app shows %q: an admin could not compare them", fp, r.TokenFingerprint)
	}
	waitReady(t, rte)
	if _, err := oa.App.Submit(context.Background(), app.JobRequest{Runner: name, JobStart: protocol.JobStart{Playbook: "hello.yml"}}); err == nil {
		t.Fatal("the app queued a job for a runner nobody approved")
	}

	mark := rte.Mark()
	if err := oa.App.Approve(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	rte.WaitLogAfter(mark, "the app approved this runner", 30*time.Second)
	jr := oa.rig(rte, name)
	j := jr.submit(protocol.JobStart{Playbook: "hello.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(`{"who":"outbound"}`)})
	end := jr.waitEnd(j.ID, 2*time.Minute)
	s := jr.story(j.ID)
	if end.Status != protocol.StatusSuccess || !strings.Contains(s.Output, "hello outbound") {
		t.Fatalf("job %+v with output:\n%s\nwant success saying hello outbound", end, s.Output)
	}
	if n := countLog(rte, "socket open"); n != 1 {
		t.Fatalf("the RTE opened %d sockets, want the one it joined on", n)
	}
	if n := oa.dialsOf(name); n != 1 {
		t.Fatalf("the app saw %d dials from %s, want 1", n, name)
	}
	noRace(t, rte)
}

// TestOutboundJoinTokenAndRefusals: a join token approves at once; a wrong one is refused with
// a reason the RTE logs, and a rejected runner is told why; neither comes back soon.
func TestOutboundJoinTokenAndRefusals(t *testing.T) {
	oa := newOutboundApp(t, "")
	srv := httptest.NewServer(oa)
	t.Cleanup(srv.Close)

	joined := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-joined", "RTE_JOIN_TOKEN="+joinToken)...)
	refused := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-refused", "RTE_JOIN_TOKEN=not-the-join-token-0123456789")...)
	rejected := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-rejected")...)

	joined.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
	oa.waitRunner("rte-joined", app.StateApproved)

	line := refused.WaitLog("the app refused this runner", 30*time.Second)
	if e, _ := line["error"].(string); !strings.Contains(e, "403") || !strings.Contains(e, "not the app's join token") {
		t.Fatalf("refusal logged with error %q, want the 403 and the app's reason", e)
	}
	if _, err := oa.Store.GetRunner(context.Background(), "rte-refused"); !errors.Is(err, app.ErrNotFound) {
		t.Fatalf("a runner with a wrong join token was stored: %v", err)
	}

	rejected.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(false))
	oa.waitRunner("rte-rejected", app.StateWaiting)
	mark := rejected.Mark()
	if err := oa.App.Reject(context.Background(), "rte-rejected", "not one of ours"); err != nil {
		t.Fatal(err)
	}
	line = rejected.WaitLogAfter(mark, "the app rejected this runner and removed it", 30*time.Second)
	if reason, _ := line["reason"].(string); !strings.Contains(reason, "not one of ours") {
		t.Fatalf("rejection logged with reason %q, want the admin's", reason)
	}

	// Both stay away: the default backoff after a refusal or a rejection is minutes. The
	// window is several times the longest normal backoff's first steps (1 s, 2 s).
	refusedDials, rejectedDials := oa.dialsOf("rte-refused"), oa.dialsOf("rte-rejected")
	time.Sleep(4 * time.Second)
	if n := oa.dialsOf("rte-refused") - refusedDials; n != 0 {
		t.Fatalf("the refused RTE dialled %d more times within 4s", n)
	}
	if n := oa.dialsOf("rte-rejected") - rejectedDials; n != 0 {
		t.Fatalf("the rejected RTE dialled %d more times within 4s", n)
	}
	if n := countLog(refused, "the app refused this runner"); n != 1 {
		t.Fatalf("the refused RTE logged the refusal %d times, want once", n)
	}
	if _, err := oa.Store.GetRunner(context.Background(), "rte-rejected"); !errors.Is(err, app.ErrNotFound) {
		t.Fatalf("the rejected runner is still stored: %v", err)
	}
	noRace(t, joined, refused, rejected)
}

// TestOutboundAppRestartMidJob stops the app while a job prints, keeps it away for a while,
// and starts it again on the same port and store: the RTE dials again with backoff, resends
// what was not acked, and every line is stored exactly once.
func TestOutboundAppRestartMidJob(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "app.db")
	oa := newOutboundApp(t, dbPath)
	srv := httptest.NewServer(oa)
	addr := srv.Listener.Addr().String()
	const name = "rte-restart"
	rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, name, "RTE_JOIN_TOKEN="+joinToken)...)
	rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))

	const lines = 4000
	jr := oa.rig(rte, name)
	j := jr.submit(protocol.JobStart{Playbook: "lines.yml", Inventories: []string{"local.ini"},
		Extravars: json.RawMessage(fmt.Sprintf(`{"lines":%d,"batches":8,"pause":1}`, lines))})
	jr.waitState(j.ID, app.JobRunning, time.Minute)
	testenv.Poll(time.Minute, func() bool { return len(jr.records(j.ID)) >= 2 })

	mark := rte.Mark()
	oa.Stop()
	srv.Close()
	rte.WaitLogAfter(mark, "cannot reach the app", 30*time.Second)
	time.Sleep(2 * time.Second) // the job goes on printing into the spool

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	oa2 := newOutboundApp(t, dbPath)
	srv2 := &httptest.Server{Listener: ln, Config: &http.Server{Handler: oa2}}
	srv2.Start()
	t.Cleanup(srv2.Close)

	rte.WaitLogAfter(mark, "the app is reachable again", time.Minute)
	jr2 := oa2.rig(rte, name)
	end := jr2.waitEnd(j.ID, 2*time.Minute)
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("job %+v, want success", end)
	}
	s := jr2.story(j.ID)
	checkLines(t, s.Output, lines)
	if countLog(rte, "resent spooled records") == 0 {
		t.Fatal("the RTE never resent spooled records after the app came back")
	}
	t.Logf("%d records, %d bytes of output, each stored once across the app's restart", len(s.Records), len(s.Output))
	noRace(t, rte)
}

// TestOutboundTLSAndProxy: the app's certificate from a private CA, trusted through
// NODE_EXTRA_CA_CERTS (and refused without it); a self-signed app with APP_TLS_VERIFY=0; and
// an HTTP CONNECT proxy in the path, asked for a name only the proxy can resolve.
func TestOutboundTLSAndProxy(t *testing.T) {
	oa := newOutboundApp(t, "")

	t.Run("private CA", func(t *testing.T) {
		ca := newE2ECA(t)
		srv := httptest.NewUnstartedServer(oa)
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t)}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(caFile, ca.pem, 0o644); err != nil {
			t.Fatal(err)
		}

		untrusting := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-no-ca", "RTE_JOIN_TOKEN="+joinToken)...)
		line := untrusting.WaitLog("NODE_EXTRA_CA_CERTS", 30*time.Second)
		if e, _ := line["error"].(string); !strings.Contains(e, "certificate") {
			t.Fatalf("the unverified app was logged with error %q, want the certificate problem", e)
		}

		rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-ca",
			"RTE_JOIN_TOKEN="+joinToken, "NODE_EXTRA_CA_CERTS="+caFile)...)
		rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
		if n := oa.dialsOf("rte-no-ca"); n != 0 {
			t.Fatalf("the app saw %d requests from the RTE that could not verify it: its token went out", n)
		}
		noRace(t, untrusting, rte)
	})

	t.Run("verification off", func(t *testing.T) {
		srv := httptest.NewTLSServer(oa) // httptest's own self-signed certificate
		t.Cleanup(srv.Close)
		rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv(srv.URL, "rte-noverify",
			"RTE_JOIN_TOKEN="+joinToken, "APP_TLS_VERIFY=0")...)
		rte.WaitLog("APP_TLS_VERIFY=0", 10*time.Second)
		rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
		noRace(t, rte)
	})

	t.Run("CONNECT proxy", func(t *testing.T) {
		srv := httptest.NewServer(oa)
		t.Cleanup(srv.Close)
		_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
		appHost := "app.rte-e2e.invalid:" + port
		px := testenv.StartConnectProxy(t, map[string]string{appHost: srv.Listener.Addr().String()})
		rte := startRTE(t, t.TempDir(), freePort(t), outboundEnv("http://"+appHost, "rte-proxied",
			"RTE_JOIN_TOKEN="+joinToken, "HTTPS_PROXY=http://"+px.Addr())...)
		rte.WaitLogMatch(0, "welcomed", 30*time.Second, welcomedWith(true))
		if got := px.Seen(); len(got) == 0 || got[0] != appHost {
			t.Fatalf("the proxy was asked for %v, want CONNECT %s", got, appHost)
		}
		noRace(t, rte)
	})
}

// e2eCA is a private certificate authority and the PEM an operator would hand the RTE.
type e2eCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newE2ECA(t *testing.T) *e2eCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rte e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &e2eCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues the app's certificate for 127.0.0.1.
func (ca *e2eCA) leaf(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "app"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
