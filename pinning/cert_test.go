package pinning_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/pinning"
	"github.com/rte-project/rte/protocol"
)

// newIdentity generates a fresh pair in its own temporary directory.
func newIdentity(t *testing.T, hosts ...string) *pinning.Identity {
	t.Helper()
	dir := t.TempDir()
	id, err := pinning.LoadOrCreate(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), hosts)
	if err != nil {
		t.Fatalf("LoadOrCreate: %v", err)
	}
	return id
}

func TestLoadOrCreateGeneratesAndReuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certificates") // absent: LoadOrCreate creates it
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	hosts := []string{"rte01.example.com", "localhost", "127.0.0.1", "::1", "[fd00::7]", "", "LOCALHOST"}

	first, err := pinning.LoadOrCreate(certPath, keyPath, hosts)
	if err != nil {
		t.Fatalf("first LoadOrCreate: %v", err)
	}
	if !first.Created {
		t.Errorf("first call: Created = false, want true for a generated pair")
	}
	if len(first.Warnings) != 0 {
		t.Errorf("first call: warnings %q, want none", first.Warnings)
	}

	for path, want := range map[string]os.FileMode{dir: 0o700, keyPath: 0o600, certPath: 0o644} {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatalf("stat %s: %v", path, err)
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s has mode %04o, want %04o", path, got, want)
		}
	}
	for _, leftover := range []string{certPath + ".tmp", keyPath + ".tmp"} {
		if _, err := os.Stat(leftover); !os.IsNotExist(err) {
			t.Errorf("temporary file %s left behind (stat error %v)", leftover, err)
		}
	}

	leaf := first.Certificate.Leaf
	if leaf == nil || !bytes.Equal(leaf.Raw, first.DER) {
		t.Fatalf("Certificate.Leaf is not the DER returned")
	}
	if _, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok {
		t.Errorf("public key is %T, want *ecdsa.PublicKey", leaf.PublicKey)
	}
	if got, want := leaf.DNSNames, []string{"rte01.example.com", "localhost"}; !slices.Equal(got, want) {
		t.Errorf("DNS SANs = %q, want %q", got, want)
	}
	var ips []string
	for _, ip := range leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	if want := []string{"127.0.0.1", "::1", "fd00::7"}; !slices.Equal(ips, want) {
		t.Errorf("IP SANs = %q, want %q", ips, want)
	}
	for _, h := range []string{"rte01.example.com", "localhost", "127.0.0.1", "::1"} {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("certificate does not cover %s: %v", h, err)
		}
	}
	if leaf.SerialNumber.BitLen() < 64 {
		t.Errorf("serial number has %d bits, want a random 128-bit number", leaf.SerialNumber.BitLen())
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life < 9*365*24*time.Hour {
		t.Errorf("validity is %v, want about ten years", life)
	}
	if !leaf.NotBefore.Before(time.Now()) {
		t.Errorf("NotBefore %v is not in the past", leaf.NotBefore)
	}
	block, _ := pem.Decode(first.PEM)
	if block == nil || block.Type != "CERTIFICATE" || !bytes.Equal(block.Bytes, first.DER) {
		t.Errorf("PEM does not hold the DER certificate: %q", first.PEM)
	}
	onDisk, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, first.PEM) {
		t.Errorf("PEM returned differs from the file written")
	}

	second, err := pinning.LoadOrCreate(certPath, keyPath, []string{"another-name.example.com"})
	if err != nil {
		t.Fatalf("second LoadOrCreate: %v", err)
	}
	if second.Created {
		t.Errorf("second call: Created = true, want false (the pair exists)")
	}
	if !bytes.Equal(second.DER, first.DER) {
		t.Errorf("second call returned a different certificate (%s), want the same one (%s): the pin must survive a restart",
			second.Fingerprint(), first.Fingerprint())
	}
	if second.Fingerprint() != protocol.CertificateFingerprint(first.DER) || second.SHA256() != protocol.CertificateSHA256(first.DER) {
		t.Errorf("fingerprints %s / %s do not match the protocol package's", second.Fingerprint(), second.SHA256())
	}
}

func TestLoadOrCreateNoHosts(t *testing.T) {
	id := newIdentity(t)
	if id.Certificate.Leaf.Subject.CommonName != "rte" {
		t.Errorf("common name %q, want %q when no host is given", id.Certificate.Leaf.Subject.CommonName, "rte")
	}
}

// TestLoadOrCreateFinishesInterruptedPair simulates a crash between renaming the key and renaming
// the certificate into place: the next start must complete the pair, not refuse or regenerate.
func TestLoadOrCreateFinishesInterruptedPair(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	orig, err := pinning.LoadOrCreate(certPath, keyPath, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(certPath, certPath+".tmp"); err != nil {
		t.Fatal(err)
	}
	got, err := pinning.LoadOrCreate(certPath, keyPath, []string{"localhost"})
	if err != nil {
		t.Fatalf("LoadOrCreate after an interrupted write: %v", err)
	}
	if !bytes.Equal(got.DER, orig.DER) {
		t.Errorf("recovered certificate %s, want the interrupted one %s", got.Fingerprint(), orig.Fingerprint())
	}
	if !got.Created {
		t.Errorf("Created = false, want true: this start is the first to use the pair")
	}
	if _, err := os.Stat(certPath + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary certificate still present after recovery (stat error %v)", err)
	}
}

func TestLoadOrCreateWarnsAboutOpenKey(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if _, err := pinning.LoadOrCreate(certPath, keyPath, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyPath, 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := pinning.LoadOrCreate(certPath, keyPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(id.Warnings) != 1 || !strings.Contains(id.Warnings[0], "chmod 600") {
		t.Errorf("warnings %q, want one telling to chmod 600 the key", id.Warnings)
	}
}

func TestLoadOrCreateAcceptsOperatorPair(t *testing.T) {
	// An operator's own pair: SEC 1 key after an EC PARAMETERS block, certificate followed by an
	// intermediate, valid for less than 30 days (a warning, not a refusal).
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	key, der := selfSigned(t, time.Now().Add(-time.Hour), time.Now().Add(10*24*time.Hour))
	_, otherDER := selfSigned(t, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	sec1, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})...)
	certPEM := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherDER})...)
	writeFile(t, keyPath, keyPEM, 0o600)
	writeFile(t, certPath, certPEM, 0o644)

	id, err := pinning.LoadOrCreate(certPath, keyPath, nil)
	if err != nil {
		t.Fatalf("LoadOrCreate of an operator's pair: %v", err)
	}
	if !bytes.Equal(id.DER, der) {
		t.Errorf("DER is not the leaf (first certificate of the file)")
	}
	if len(id.Certificate.Certificate) != 2 {
		t.Errorf("chain has %d certificates, want leaf and intermediate", len(id.Certificate.Certificate))
	}
	if id.Created {
		t.Errorf("Created = true for files the operator provided")
	}
	if len(id.Warnings) != 1 || !strings.Contains(id.Warnings[0], "expires") {
		t.Errorf("warnings %q, want one about the close expiry", id.Warnings)
	}
}

func TestLoadOrCreateRefuses(t *testing.T) {
	good := func(t *testing.T) (string, string) {
		dir := t.TempDir()
		c, k := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		if _, err := pinning.LoadOrCreate(c, k, []string{"localhost"}); err != nil {
			t.Fatal(err)
		}
		return c, k
	}
	tests := []struct {
		name  string
		setup func(t *testing.T) (certPath, keyPath string)
		want  []string // every one must appear in the error
	}{
		{"key without certificate", func(t *testing.T) (string, string) {
			c, k := good(t)
			mustRemove(t, c)
			return c, k
		}, []string{"key.pem exists but its certificate", "cert.pem does not", "delete"}},
		{"certificate without key", func(t *testing.T) (string, string) {
			c, k := good(t)
			mustRemove(t, k)
			return c, k
		}, []string{"cert.pem exists but its key", "key.pem does not", "delete"}},
		{"lone key with a foreign temporary certificate", func(t *testing.T) (string, string) {
			c, k := good(t)
			c2, _ := good(t)
			mustRemove(t, c)
			copyFile(t, c2, c+".tmp")
			return c, k
		}, []string{"key.pem exists but its certificate"}},
		{"certificate is garbage", func(t *testing.T) (string, string) {
			c, k := good(t)
			writeFile(t, c, []byte("hello, not a certificate\n"), 0o644)
			return c, k
		}, []string{"cert.pem", "not PEM", "BEGIN CERTIFICATE"}},
		{"key is garbage", func(t *testing.T) (string, string) {
			c, k := good(t)
			writeFile(t, k, []byte("garbage"), 0o600)
			return c, k
		}, []string{"key.pem", "not PEM"}},
		{"key block does not parse", func(t *testing.T) (string, string) {
			c, k := good(t)
			writeFile(t, k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}), 0o600)
			return c, k
		}, []string{"key.pem", "PRIVATE KEY block does not parse"}},
		{"encrypted key", func(t *testing.T) (string, string) {
			c, k := good(t)
			writeFile(t, k, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), 0o600)
			return c, k
		}, []string{"key.pem", "encrypted", "decrypt"}},
		{"key of another certificate", func(t *testing.T) (string, string) {
			c, _ := good(t)
			_, k2 := good(t)
			return c, k2
		}, []string{"does not match certificate", "cert.pem"}},
		{"expired certificate", func(t *testing.T) (string, string) {
			dir := t.TempDir()
			c, k := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
			key, der := selfSigned(t, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
			p8, err := x509.MarshalPKCS8PrivateKey(key)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, k, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}), 0o600)
			writeFile(t, c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
			return c, k
		}, []string{"cert.pem expired", "delete", "approve"}},
		{"certificate path is a directory", func(t *testing.T) (string, string) {
			dir := t.TempDir()
			c := filepath.Join(dir, "cert.pem")
			if err := os.Mkdir(c, 0o700); err != nil {
				t.Fatal(err)
			}
			return c, filepath.Join(dir, "key.pem")
		}, []string{"cert.pem is not a regular file"}},
		{"same path for both", func(t *testing.T) (string, string) {
			p := filepath.Join(t.TempDir(), "both.pem")
			return p, p
		}, []string{"same file"}},
		{"empty path", func(t *testing.T) (string, string) {
			return "", filepath.Join(t.TempDir(), "key.pem")
		}, []string{"HTTPS_CERT"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, k := tt.setup(t)
			id, err := pinning.LoadOrCreate(c, k, []string{"localhost"})
			if err == nil {
				t.Fatalf("LoadOrCreate accepted it (certificate %s), want an error containing %q", id.Fingerprint(), tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadCertificateFile(t *testing.T) {
	id := newIdentity(t, "localhost")
	dir := t.TempDir()
	pemPath := filepath.Join(dir, "c.pem")
	derPath := filepath.Join(dir, "c.der")
	writeFile(t, pemPath, id.PEM, 0o644)
	writeFile(t, derPath, id.DER, 0o644)
	for _, p := range []string{pemPath, derPath} {
		der, err := pinning.LoadCertificateFile(p)
		if err != nil {
			t.Fatalf("LoadCertificateFile(%s): %v", p, err)
		}
		if !bytes.Equal(der, id.DER) {
			t.Errorf("LoadCertificateFile(%s) returned other bytes than the certificate", p)
		}
	}

	garbage := filepath.Join(dir, "g.pem")
	writeFile(t, garbage, []byte("not a certificate"), 0o644)
	badDER := filepath.Join(dir, "g.der")
	writeFile(t, badDER, []byte{0x30, 0x03, 1, 2, 3}, 0o644)
	for path, want := range map[string]string{
		garbage:                      "not PEM",
		badDER:                       "does not parse",
		filepath.Join(dir, "absent"): "read certificate",
	} {
		if _, err := pinning.LoadCertificateFile(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadCertificateFile(%s) = %v, want an error containing %q", path, err, want)
		}
	}
}

// selfSigned makes a P-256 certificate with the given validity, for pairs LoadOrCreate would not
// generate itself.
func selfSigned(t *testing.T, notBefore, notAfter time.Time) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "test"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func writeFile(t *testing.T, path string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, data, 0o644)
}

func mustRemove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}
