package check

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/rte-project/rte/protocol"
)

// identifyRequest is a WS-Management Identify (DMTF DSP0226, section 11): the one request a
// WinRM listener answers without credentials when asked with the WSMANIDENTIFY header.
const identifyRequest = `<?xml version="1.0" encoding="UTF-8"?>` +
	`<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" xmlns:wsmid="` + wsmidNamespace + `">` +
	`<s:Header/><s:Body><wsmid:Identify/></s:Body></s:Envelope>`

const wsmidNamespace = "http://schemas.dmtf.org/wbem/wsman/identity/1/wsmanidentity.xsd"

// maxIdentifyResponse bounds what is read of the answer; a real IdentifyResponse is under 1 KiB.
const maxIdentifyResponse = 64 << 10

// winrmAuthSchemes are the WWW-Authenticate schemes a WinRM listener offers.
var winrmAuthSchemes = []string{"negotiate", "kerberos", "credssp", "basic"}

// checkWinRM sends one Identify and reads what answers. See docs/connection-checks.md for why
// a 401 from a WinRM listener counts as connected.
func (ch *Checker) checkWinRM(ctx context.Context, b *batch, t protocol.CheckTarget) result {
	e := newEndpoint(t, defaultWinRMPort)
	scheme := "https"
	if e.port == ch.winrmHTTP {
		scheme = "http"
	}
	conn, stop, failed := ch.dial(ctx, b, e)
	if failed != nil {
		return *failed
	}
	defer conn.Close()
	defer stop()

	if scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: e.host, RootCAs: ch.roots, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			return tlsFailure(ctx, b, e, err)
		}
		conn = tc
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, scheme+"://"+e.addr+"/wsman", strings.NewReader(identifyRequest))
	if err != nil {
		// Only a host that makes no URL gets here; the protocol lets any string through.
		return result{protocol.CheckUnreachable, fmt.Sprintf("cannot make a WinRM request for host %q: %v", e.host, err)}
	}
	req.Header.Set("Content-Type", "application/soap+xml;charset=UTF-8")
	req.Header.Set("WSMANIDENTIFY", "unauthenticated")
	req.Header.Set("User-Agent", "rte-check")
	req.Close = true
	if err := req.Write(conn); err != nil {
		return winrmIOFailure(ctx, b, e, scheme, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return winrmIOFailure(ctx, b, e, scheme, err)
	}
	defer resp.Body.Close()

	switch resp.StatusCode {
	case http.StatusOK:
		ok, err := isIdentifyResponse(io.LimitReader(resp.Body, maxIdentifyResponse))
		if err != nil && (ctx.Err() != nil || isTimeout(err)) {
			return winrmIOFailure(ctx, b, e, scheme, err)
		}
		if ok {
			return result{protocol.CheckConnected, fmt.Sprintf("a WinRM listener answered the Identify request over %s", scheme)}
		}
	case http.StatusUnauthorized:
		if schemes := authSchemes(resp.Header.Values("WWW-Authenticate")); len(schemes) > 0 {
			return result{protocol.CheckConnected, fmt.Sprintf("a WinRM listener answers over %s and asks for authentication (%s); the check sends no credentials, so they are not verified", scheme, strings.Join(schemes, ", "))}
		}
	}
	return result{protocol.CheckUnreachable, fmt.Sprintf("something other than WinRM answers on %s (HTTP %q to an Identify request at /wsman): check the port and that the WinRM service listens there", e.addr, resp.Status)}
}

// isIdentifyResponse reports whether r holds an XML document with a wsmid:IdentifyResponse
// element, under whatever prefix. The error is a read error of r, for telling a timeout from
// another kind of answer; a body that is not XML is simply not an IdentifyResponse.
func isIdentifyResponse(r io.Reader) (bool, error) {
	d := xml.NewDecoder(r)
	for {
		tok, err := d.Token()
		if err != nil {
			var syntax *xml.SyntaxError
			if errors.Is(err, io.EOF) || errors.As(err, &syntax) {
				err = nil
			}
			return false, err
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "IdentifyResponse" && se.Name.Space == wsmidNamespace {
			return true, nil
		}
	}
}

// authSchemes returns the WinRM authentication schemes among WWW-Authenticate values.
func authSchemes(values []string) []string {
	var out []string
	for _, v := range values {
		for _, challenge := range strings.Split(v, ",") {
			scheme, _, _ := strings.Cut(strings.TrimSpace(challenge), " ")
			for _, s := range winrmAuthSchemes {
				if strings.EqualFold(scheme, s) && !containsFold(out, s) {
					out = append(out, scheme)
				}
			}
		}
	}
	return out
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

func tlsFailure(ctx context.Context, b *batch, e endpoint, err error) result {
	var (
		verify    *tls.CertificateVerificationError
		hostname  x509.HostnameError
		authority x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &hostname), errors.As(err, &authority), errors.As(err, &invalid):
		return result{protocol.CheckUnreachable, fmt.Sprintf("the TLS certificate of the WinRM listener on %s did not verify (%v): give the listener a certificate for that name from a CA the RTE trusts, or add its CA to the RTE's trust store", e.addr, err)}
	case errors.As(err, &record):
		return result{protocol.CheckUnreachable, fmt.Sprintf("%s does not answer with TLS: port 5985 is WinRM over http, any other port is tried with https", e.addr)}
	case errors.Is(ctx.Err(), context.Canceled):
		return result{protocol.CheckTimeout, fmt.Sprintf("the check was cancelled during the TLS handshake with %s, most likely because the RTE is stopping", e.addr)}
	case ctx.Err() != nil || isTimeout(err):
		return result{protocol.CheckTimeout, fmt.Sprintf("%s accepted the connection but the TLS handshake did not finish within %d ms", e.addr, b.timeout.Milliseconds())}
	default:
		return result{protocol.CheckUnreachable, fmt.Sprintf("the TLS handshake with %s failed (%v): check that a WinRM https listener is on that port", e.addr, err)}
	}
}

func winrmIOFailure(ctx context.Context, b *batch, e endpoint, scheme string, err error) result {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return result{protocol.CheckTimeout, fmt.Sprintf("the check was cancelled while waiting for %s, most likely because the RTE is stopping", e.addr)}
	case ctx.Err() != nil || isTimeout(err):
		return result{protocol.CheckTimeout, fmt.Sprintf("%s accepted the connection but did not answer the WinRM Identify request within %d ms", e.addr, b.timeout.Milliseconds())}
	default:
		return result{protocol.CheckUnreachable, fmt.Sprintf("%s does not answer as an %s server (%v): check the port (5985 is http, 5986 https)", e.addr, scheme, err)}
	}
}
