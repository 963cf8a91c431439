package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// ShortFingerprint is the first 8 hex digits of the SHA-256 of b, shown as "abcd-ef12". It is
// for people comparing two screens, not for pinning: pin the whole certificate.
func ShortFingerprint(b []byte) string {
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:4])
	return h[:4] + "-" + h[4:]
}

// TokenFingerprint is the short fingerprint of the token's UTF-8 bytes.
func TokenFingerprint(token string) string { return ShortFingerprint([]byte(token)) }

// CertificateFingerprint is the short fingerprint of a certificate's DER bytes.
func CertificateFingerprint(der []byte) string { return ShortFingerprint(der) }

// CertificateSHA256 is the full SHA-256 of a certificate's DER bytes as 64 lowercase hex digits.
func CertificateSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// ParseSHA256Fingerprint accepts a full SHA-256 fingerprint as operators copy it (upper or lower
// case, with or without colons, optionally prefixed "sha256:") and returns 64 lowercase hex digits.
func ParseSHA256Fingerprint(s string) (string, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimPrefix(t, "sha256:")
	t = strings.ReplaceAll(t, ":", "")
	if len(t) != 64 {
		return "", fmt.Errorf("certificate fingerprint %q: want the full SHA-256 as 64 hex digits, got %d", clip(s, 100), len(t))
	}
	if _, err := hex.DecodeString(t); err != nil {
		return "", fmt.Errorf("certificate fingerprint %q: not hex", clip(s, 100))
	}
	return t, nil
}

// clip bounds text from a peer before it goes into an error or a log.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
