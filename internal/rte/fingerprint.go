package rte

import (
	"fmt"
	"io"
	"strings"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// Fingerprint prints what the app's admin compares before approving this RTE: the fingerprints
// of the certificate at certPath (HTTPS_CERT's when empty) and of RTE_TOKEN. It reads only
// those two variables from environ, so it answers while other settings are still incomplete.
// A certificate that cannot be read is said on stderr and makes it return false; the token's
// line is printed either way.
func Fingerprint(certPath string, environ []string, stdout, stderr io.Writer) bool {
	var token string
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, "RTE_TOKEN="); ok {
			token = v
		}
	}
	if certPath == "" {
		certPath = "certificates/cert.pem"
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "HTTPS_CERT="); ok && v != "" {
				certPath = v
			}
		}
	}
	der, err := pinning.LoadCertificateFile(certPath)
	if err != nil {
		fmt.Fprintf(stderr, "rte fingerprint: %v\n", err)
	} else {
		fmt.Fprintf(stdout, "certificate_file: %s\n", certPath)
		fmt.Fprintf(stdout, "certificate_fingerprint: %s\n", protocol.CertificateFingerprint(der))
		fmt.Fprintf(stdout, "certificate_sha256: %s\n", protocol.CertificateSHA256(der))
	}
	if token == "" {
		fmt.Fprintln(stdout, "token_fingerprint: (RTE_TOKEN is not set)")
	} else {
		fmt.Fprintf(stdout, "token_fingerprint: %s\n", protocol.TokenFingerprint(token))
	}
	return err == nil
}
