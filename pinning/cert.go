package pinning

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rte-project/rte/internal/atomicfile"
	"github.com/rte-project/rte/protocol"
)

// CertificateValidity is how long a generated certificate is valid. The app pins the whole
// certificate and ignores its dates, so expiry protects nothing here; a short life would only
// force an admin to approve a new certificate every time it ran out. Ten years keeps the pin
// for the life of a deployment; rotate deliberately instead (docs/fingerprints-and-pinning.md).
const CertificateValidity = 10 * 365 * 24 * time.Hour

// clockSkew backdates a generated certificate's NotBefore so that a peer whose clock is a little
// behind does not see a certificate from the future.
const clockSkew = time.Hour

// expiryWarning is how close to NotAfter a loaded certificate earns a warning at start.
const expiryWarning = 30 * 24 * time.Hour

// tmpSuffix names the files a generation writes before renaming them into place. The name is
// fixed, not random, so that a start after a crash between the two renames can find the
// certificate that belongs to the key already in place and finish the pair.
const tmpSuffix = ".tmp"

// Identity is the RTE's own certificate and key, ready for a TLS listener and for registration.
type Identity struct {
	Certificate tls.Certificate // for tls.Config.Certificates; Leaf is set
	DER         []byte          // the leaf's DER bytes: what the app pins
	PEM         []byte          // the leaf as PEM, as sent in registration
	Created     bool            // true when this call generated the pair (or finished writing one a crash interrupted)

	// Warnings are problems that do not stop the start but that the caller should log at every
	// start: a key file readable by other users, a certificate close to its expiry.
	Warnings []string
}

// Fingerprint is the certificate's short fingerprint, "abcd-ef12", the one an admin compares.
func (id *Identity) Fingerprint() string { return protocol.CertificateFingerprint(id.DER) }

// SHA256 is the full SHA-256 of the certificate's DER bytes as 64 lowercase hex digits: what an
// operator gives the app with a runner that never registers, so the app can pin it.
func (id *Identity) SHA256() string { return protocol.CertificateSHA256(id.DER) }

// LoadOrCreate loads the certificate at certPath and the private key at keyPath.
//
// When both files are absent it generates a self-signed ECDSA P-256 certificate whose subject
// alternative names cover hosts (each a DNS name or an IP address, "[::1]" accepted), writes the
// key with mode 0600 and the certificate with mode 0644, creating missing parent directories with
// mode 0700, and returns Created=true. Later starts load the same files, so the certificate the
// app pinned survives a restart.
//
// The pair is written so that a crash never leaves half of it: both files are written to
// temporary names and synced before the first rename, and a start that finds the key renamed but
// the certificate not yet renamed completes the pair.
//
// It refuses, naming the file and the fix: one file without the other, a file it cannot read,
// a file without the expected PEM block, an encrypted key, a key that does not match the
// certificate, and an expired certificate.
func LoadOrCreate(certPath, keyPath string, hosts []string) (*Identity, error) {
	certExists, keyExists, err := pairState(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	switch {
	case certExists && keyExists:
		return load(certPath, keyPath)
	case !certExists && !keyExists:
		return create(certPath, keyPath, hosts)
	case keyExists:
		return recoverPair(certPath, keyPath)
	default:
		return nil, loneCertificate(certPath, keyPath)
	}
}

// pairState checks the two paths and says which of the files exist.
func pairState(certPath, keyPath string) (certExists, keyExists bool, err error) {
	if certPath == "" || keyPath == "" {
		return false, false, errors.New("certificate and key paths must both be set (HTTPS_CERT, HTTPS_KEY)")
	}
	if filepath.Clean(certPath) == filepath.Clean(keyPath) {
		return false, false, fmt.Errorf("certificate and key paths are the same file %s: set HTTPS_CERT and HTTPS_KEY to two different files", certPath)
	}
	if certExists, err = exists(certPath, "certificate"); err != nil {
		return false, false, err
	}
	keyExists, err = exists(keyPath, "key")
	return certExists, keyExists, err
}

func loneCertificate(certPath, keyPath string) error {
	return fmt.Errorf("certificate %s exists but its key %s does not: put the key that belongs to the certificate there, or delete %s to generate a new pair (an admin must then approve the new certificate)", certPath, keyPath, certPath)
}

func loneKey(certPath, keyPath string) error {
	return fmt.Errorf("key %s exists but its certificate %s does not: put the certificate that belongs to the key there, or delete %s to generate a new pair (an admin must then approve the new certificate)", keyPath, certPath, keyPath)
}

// Check tells, writing nothing, what LoadOrCreate would do with these paths: an error for
// anything it would refuse (a file missing from the pair, not parsing, not belonging to the
// other, expired), create true when neither file exists and it would generate a pair (the
// caller checks that their folders can be written). rte check-config reports it.
func Check(certPath, keyPath string) (create bool, err error) {
	certExists, keyExists, err := pairState(certPath, keyPath)
	if err != nil {
		return false, err
	}
	switch {
	case certExists && keyExists:
		_, err := load(certPath, keyPath)
		return false, err
	case !certExists && !keyExists:
		return true, nil
	case keyExists:
		// Only the pair this package was writing when the process died is completed.
		if ok, err := exists(certPath+tmpSuffix, "certificate"); err == nil && ok {
			if _, err := readPair(certPath+tmpSuffix, keyPath); err == nil {
				return false, nil
			}
		}
		return false, loneKey(certPath, keyPath)
	default:
		return false, loneCertificate(certPath, keyPath)
	}
}

// exists reports whether path names a regular file, and refuses anything it cannot tell or use.
func exists(path, what string) (bool, error) {
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s %s: %w: make it readable by the user running the RTE", what, path, err)
	}
	if !info.Mode().IsRegular() {
		return false, fmt.Errorf("%s %s is not a regular file (%s): point the setting at a PEM file", what, path, info.Mode().Type())
	}
	return true, nil
}

// recoverPair handles a key whose certificate is absent. Only the pair this package was writing
// when the process died is completed; any other lone key is refused.
func recoverPair(certPath, keyPath string) (*Identity, error) {
	lone := loneKey(certPath, keyPath)
	tmp := certPath + tmpSuffix
	if ok, err := exists(tmp, "certificate"); err != nil || !ok {
		return nil, lone
	}
	// The temporary certificate was synced before the key was renamed; it is ours only if it
	// matches the key.
	if _, err := readPair(tmp, keyPath); err != nil {
		return nil, lone
	}
	if err := os.Rename(tmp, certPath); err != nil {
		return nil, fmt.Errorf("finish writing certificate %s: %w", certPath, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(certPath)); err != nil {
		return nil, err
	}
	id, err := load(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	id.Created = true
	return id, nil
}

func load(certPath, keyPath string) (*Identity, error) {
	id, err := readPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	leaf := id.Certificate.Leaf
	now := time.Now()
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s expired on %s: delete %s and %s to generate a new self-signed pair, or put a new certificate and key there (either way an admin must approve the new certificate)",
			certPath, leaf.NotAfter.UTC().Format(time.RFC3339), certPath, keyPath)
	}
	if leaf.NotAfter.Sub(now) < expiryWarning {
		id.Warnings = append(id.Warnings, fmt.Sprintf("certificate %s expires on %s: the RTE will refuse to start after that; rotate it now (docs/fingerprints-and-pinning.md)",
			certPath, leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	if info, err := os.Stat(keyPath); err == nil && info.Mode().Perm()&0o077 != 0 {
		id.Warnings = append(id.Warnings, fmt.Sprintf("key %s has mode %04o: other users can read it; chmod 600 %s", keyPath, info.Mode().Perm(), keyPath))
	}
	return id, nil
}

// readPair reads and checks a certificate file and its key file. It does not judge dates.
func readPair(certPath, keyPath string) (*Identity, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("read certificate %s: %w", certPath, err)
	}
	chain, err := certificateBlocks(certPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w: provide a PEM certificate (-----BEGIN CERTIFICATE-----), or delete it and %s to generate a new pair", certPath, err, keyPath)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, fmt.Errorf("certificate %s: first certificate does not parse: %w", certPath, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("read key %s: %w", keyPath, err)
	}
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", keyPath, err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("key %s does not match certificate %s: put the key that belongs to the certificate there, or delete both files to generate a new pair", keyPath, certPath)
	}
	return &Identity{
		Certificate: tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf},
		DER:         chain[0],
		PEM:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: chain[0]}),
	}, nil
}

// certificateBlocks returns the DER of every CERTIFICATE block in order: the leaf, then any
// intermediates the operator appended.
func certificateBlocks(data []byte) ([][]byte, error) {
	var chain [][]byte
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			chain = append(chain, block.Bytes)
		}
	}
	if len(chain) == 0 {
		return nil, errors.New("not PEM: no CERTIFICATE block found")
	}
	return chain, nil
}

// parsePrivateKey accepts the unencrypted key formats openssl and Go write: PKCS #8, SEC 1 (EC)
// and PKCS #1 (RSA).
func parsePrivateKey(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("not PEM: no PRIVATE KEY block found; provide an unencrypted PEM key")
		}
		var key any
		var err error
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("key is encrypted; the RTE cannot ask for a passphrase: decrypt it (openssl pkey -in KEY -out KEY.plain) and keep the file at mode 0600")
		default:
			continue // e.g. "EC PARAMETERS" ahead of the key, as openssl ecparam writes it
		}
		if err != nil {
			return nil, fmt.Errorf("%s block does not parse: %w", block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s block holds a %T, which cannot sign", block.Type, key)
		}
		return signer, nil
	}
}

func create(certPath, keyPath string, hosts []string) (*Identity, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	dnsNames, ips := splitHosts(hosts)
	commonName := "rte"
	if len(dnsNames) > 0 {
		commonName = dnsNames[0]
	} else if len(ips) > 0 {
		commonName = ips[0].String()
	}
	notBefore := time.Now().Add(-clockSkew).UTC().Truncate(time.Second)
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"rte self-signed"}},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(CertificateValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	if err := writePair(certPath, keyPath, certPEM, keyPEM); err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse generated certificate: %w", err)
	}
	return &Identity{
		Certificate: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		DER:         der,
		PEM:         certPEM,
		Created:     true,
	}, nil
}

// splitHosts sorts hosts into DNS names and IP addresses, dropping empty entries and duplicates.
func splitHosts(hosts []string) ([]string, []net.IP) {
	var dnsNames []string
	var ips []net.IP
	seen := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		if ip := net.ParseIP(h); ip != nil {
			if !seen[ip.String()] {
				seen[ip.String()] = true
				ips = append(ips, ip)
			}
			continue
		}
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if h != "" && !seen[h] {
			seen[h] = true
			dnsNames = append(dnsNames, h)
		}
	}
	return dnsNames, ips
}

// writePair writes both files so that a crash leaves either no pair, a whole pair, or a key whose
// certificate waits under its temporary name (which recoverPair completes).
func writePair(certPath, keyPath string, certPEM, keyPEM []byte) error {
	dirs := []string{filepath.Dir(keyPath)}
	if d := filepath.Dir(certPath); d != dirs[0] {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create certificate directory %s: %w", d, err)
		}
	}
	if err := writeSynced(keyPath+tmpSuffix, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeSynced(certPath+tmpSuffix, certPEM, 0o644); err != nil {
		return err
	}
	// The key goes first: a lone key with a matching temporary certificate is recognisable as
	// this package's unfinished work, while a lone certificate would have no such proof.
	if err := os.Rename(keyPath+tmpSuffix, keyPath); err != nil {
		return fmt.Errorf("rename key into place %s: %w", keyPath, err)
	}
	if err := os.Rename(certPath+tmpSuffix, certPath); err != nil {
		return fmt.Errorf("rename certificate into place %s: %w", certPath, err)
	}
	for _, d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil {
			return err
		}
	}
	return nil
}

// writeSynced creates path afresh (never following a symlink left in its place), writes data,
// sets perm regardless of the umask, and syncs the file.
func writeSynced(path string, data []byte, perm os.FileMode) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// LoadCertificateFile returns the DER bytes of the first certificate in a PEM file (a raw DER
// file is accepted too), for printing the fingerprints of a certificate an operator holds.
func LoadCertificateFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read certificate %s: %w", path, err)
	}
	var der []byte
	if chain, perr := certificateBlocks(data); perr == nil {
		der = chain[0]
	} else if bytes.HasPrefix(data, []byte{0x30}) {
		der = data // an ASN.1 SEQUENCE: perhaps a DER file; parsing below decides
	} else {
		return nil, fmt.Errorf("certificate %s: %w: give a PEM (-----BEGIN CERTIFICATE-----) or DER certificate file", path, perr)
	}
	if _, err := x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("certificate %s does not parse: %w", path, err)
	}
	return der, nil
}
