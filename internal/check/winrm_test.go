package check_test

import (
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rte-project/rte/internal/check"
	"github.com/rte-project/rte/protocol"
)

// identifyResponse is what Windows answers to an unauthenticated Identify.
const identifyResponse = `<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xml:lang="en-US"><s:Header/>` +
	`<s:Body><wsmid:IdentifyResponse xmlns:wsmid="http://schemas.dmtf.org/wbem/wsman/identity/1/wsmanidentity.xsd">` +
	`<wsmid:ProtocolVersion>http://schemas.dmtf.org/wbem/wsman/1/wsman.xsd</wsmid:ProtocolVersion>` +
	`<wsmid:ProductVendor>Microsoft Corporation</wsmid:ProductVendor>` +
	`<wsmid:ProductVersion>OS: 0.0.0 SP: 0.0 Stack: 3.0</wsmid:ProductVersion>` +
	`</wsmid:IdentifyResponse></s:Body></s:Envelope>`

// winrmListener answers like the WinRM service: an Identify that asks to go unauthenticated
// gets an IdentifyResponse, anything else at /wsman a 401 asking for Negotiate or Kerberos,
// and any other path a 404 (HTTP.sys's answer for a URL no service registered).
func winrmListener(anonymousIdentify bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/wsman" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		identify := r.Method == http.MethodPost &&
			strings.HasPrefix(r.Header.Get("Content-Type"), "application/soap+xml") &&
			strings.Contains(string(body), "Identify")
		if anonymousIdentify && identify && r.Header.Get("WSMANIDENTIFY") == "unauthenticated" {
			w.Header().Set("Content-Type", "application/soap+xml;charset=UTF-8")
			io.WriteString(w, identifyResponse)
			return
		}
		w.Header().Add("WWW-Authenticate", "Negotiate")
		w.Header().Add("WWW-Authenticate", "Kerberos")
		w.WriteHeader(http.StatusUnauthorized)
	}
}

func serverPort(t *testing.T, s *httptest.Server) int {
	t.Helper()
	_, port, err := net.SplitHostPort(s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var p int
	fmt.Sscan(port, &p)
	return p
}

func TestWinRM(t *testing.T) {
	plainWeb := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html><body>It works!</body></html>")
	})
	basicOnly := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="WSMAN"`)
		w.WriteHeader(http.StatusUnauthorized)
	})
	bearer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="api"`)
		w.WriteHeader(http.StatusUnauthorized)
	})
	soapButNotIdentify := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/soap+xml")
		io.WriteString(w, `<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body/></s:Envelope>`)
	})

	cases := []struct {
		name       string
		handler    http.Handler
		tls        bool
		trust      bool // the checker trusts the test server's certificate
		wantStatus string
		wantParts  []string
	}{
		{"identify answered", winrmListener(true), false, false, protocol.CheckConnected, []string{"over http"}},
		{"identify answered over https", winrmListener(true), true, true, protocol.CheckConnected, []string{"over https"}},
		{"listener asks for authentication", winrmListener(false), false, false, protocol.CheckConnected, []string{"asks for authentication (Negotiate, Kerberos)", "not verified"}},
		{"listener asks for basic authentication", basicOnly, false, false, protocol.CheckConnected, []string{"(Basic)"}},
		{"web server", plainWeb, false, false, protocol.CheckUnreachable, []string{"something other than WinRM", `"200 OK"`}},
		{"web server wanting a bearer token", bearer, false, false, protocol.CheckUnreachable, []string{"something other than WinRM", "401"}},
		{"SOAP but no IdentifyResponse", soapButNotIdentify, false, false, protocol.CheckUnreachable, []string{"something other than WinRM"}},
		{"no /wsman", http.NotFoundHandler(), false, false, protocol.CheckUnreachable, []string{"something other than WinRM", "404"}},
		{"certificate from an unknown CA", winrmListener(true), true, false, protocol.CheckUnreachable, []string{"certificate", "did not verify"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewUnstartedServer(tc.handler)
			// The refused certificate is the point of one case; keep its log line out.
			srv.Config.ErrorLog = log.New(io.Discard, "", 0)
			if tc.tls {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			defer srv.Close()
			cfg := check.Config{}
			if tc.trust {
				cfg.WinRMRoots = x509.NewCertPool()
				cfg.WinRMRoots.AddCert(srv.Certificate())
			}
			ch := newChecker(t, cfg)
			port := serverPort(t, srv)
			if !tc.tls {
				check.SetWinRMHTTPPort(ch, port)
			}
			o := runOne(t, ch, protocol.CheckTarget{Name: "win01", Host: "127.0.0.1", Port: port, Transport: protocol.TransportWinRM}, 5000)
			wantOutcome(t, o, tc.wantStatus, tc.wantParts...)
		})
	}

	winrm := func(port int) protocol.CheckTarget {
		return protocol.CheckTarget{Name: "win01", Host: "127.0.0.1", Port: port, Transport: protocol.TransportWinRM}
	}
	t.Run("closed port", func(t *testing.T) {
		ch := newChecker(t, check.Config{})
		wantOutcome(t, runOne(t, ch, winrm(closedPort(t)), 2000), protocol.CheckUnreachable, "refused")
	})
	t.Run("accepts but never answers", func(t *testing.T) {
		ch := newChecker(t, check.Config{})
		port := silentListener(t)
		check.SetWinRMHTTPPort(ch, port)
		wantOutcome(t, runOne(t, ch, winrm(port), 300), protocol.CheckTimeout, "did not answer the WinRM Identify request within 300 ms")
	})
	t.Run("https port, no TLS", func(t *testing.T) {
		srv := httptest.NewServer(winrmListener(true))
		defer srv.Close()
		ch := newChecker(t, check.Config{})
		wantOutcome(t, runOne(t, ch, winrm(serverPort(t, srv)), 2000), protocol.CheckUnreachable, "does not answer with TLS")
	})
	t.Run("not HTTP at all", func(t *testing.T) {
		ch := newChecker(t, check.Config{})
		port := fakeListener(t, []byte("SSH-2.0-OpenSSH_9.2\r\n"))
		check.SetWinRMHTTPPort(ch, port)
		wantOutcome(t, runOne(t, ch, winrm(port), 2000), protocol.CheckUnreachable, "does not answer as an http server")
	})
}
