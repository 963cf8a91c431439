package check

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// keyFiles are the private keys offered, in this order: the default identity files of OpenSSH,
// and so of ansible, without the obsolete DSA and the security-key types a check cannot use.
var keyFiles = []string{"id_ed25519", "id_ecdsa", "id_rsa"}

// maxKeyFile bounds what is read of a private key file; real ones are a few KiB.
const maxKeyFile = 1 << 20

// clientVersion is what the hosts' sshd logs show for a check, so an operator can tell checks
// from ansible's own logins.
const clientVersion = "SSH-2.0-rte-check"

// hostKeyAlgorithms is every host key algorithm x/crypto can verify, in its order of
// preference, with SHA-1 RSA last, for hosts whose OpenSSH predates rsa-sha2 (as x/crypto's
// default list does).
var hostKeyAlgorithms = slices.Concat(ssh.SupportedAlgorithms().HostKeys, []string{ssh.KeyAlgoRSA, ssh.CertAlgoRSAv01})

// sshFiles is what one check reads from Config.SSHDir.
type sshFiles struct {
	signers  []ssh.Signer
	keyTypes []string // of signers, for messages
	skipped  []string // key files present but unusable, with why: "id_rsa: encrypted"
	hostKeys ssh.HostKeyCallback
	// hostKeysErr is why known_hosts could not be read; no SSH target is tried then.
	hostKeysErr error
}

func (ch *Checker) loadSSHFiles() *sshFiles {
	f := &sshFiles{}
	for _, name := range keyFiles {
		signer, skip := ch.readKey(filepath.Join(ch.sshDir, name))
		if skip != "" {
			f.skipped = append(f.skipped, name+": "+skip)
		}
		if signer != nil {
			f.signers = append(f.signers, signer)
			f.keyTypes = append(f.keyTypes, signer.PublicKey().Type())
		}
	}
	f.hostKeys, f.hostKeysErr = ch.readKnownHosts()
	return f
}

// readKey returns the signer of one private key file, or nil and why it is skipped (nothing
// when the file does not exist, which is normal).
func (ch *Checker) readKey(path string) (ssh.Signer, string) {
	file, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ""
	}
	if err != nil {
		ch.warnOnce("open "+path+err.Error(), "skip private key that cannot be opened", zap.String("path", path), zap.Error(err))
		return nil, "cannot be opened"
	}
	defer file.Close()
	info, err := file.Stat()
	if err != nil {
		ch.warnOnce("stat "+path+err.Error(), "skip private key that cannot be read", zap.String("path", path), zap.Error(err))
		return nil, "cannot be read"
	}
	// The warnings below are keyed by the file's modification time: a key that stays encrypted
	// is reported once, a key replaced by another bad one again.
	version := path + "@" + info.ModTime().String()
	data, err := io.ReadAll(io.LimitReader(file, maxKeyFile+1))
	switch {
	case err != nil:
		ch.warnOnce(version+"read", "skip private key that cannot be read", zap.String("path", path), zap.Error(err))
		return nil, "cannot be read"
	case len(data) > maxKeyFile:
		ch.warnOnce(version+"size", "skip private key file larger than 1 MiB", zap.String("path", path))
		return nil, "too large"
	}
	signer, err := ssh.ParsePrivateKey(data)
	var encrypted *ssh.PassphraseMissingError
	switch {
	case errors.As(err, &encrypted):
		ch.warnOnce(version+"encrypted", "skip encrypted private key: connection checks use only unencrypted keys", zap.String("path", path))
		return nil, "encrypted"
	case err != nil:
		// x/crypto's parse errors name the format problem, never the key's bytes.
		ch.warnOnce(version+"parse", "skip private key that cannot be parsed", zap.String("path", path), zap.Error(err))
		return nil, "not a usable key"
	}
	return signer, ""
}

// readKnownHosts returns the callback that checks host keys against Config.KnownHosts. A
// missing file is an empty one: every host is unknown.
func (ch *Checker) readKnownHosts() (ssh.HostKeyCallback, error) {
	if _, err := os.Stat(ch.knownHosts); errors.Is(err, fs.ErrNotExist) {
		return knownhosts.New()
	}
	cb, err := knownhosts.New(ch.knownHosts)
	if err != nil {
		ch.warnOnce("known_hosts "+err.Error(), "cannot read known_hosts: ssh targets are not checked", zap.String("path", ch.knownHosts), zap.Error(err))
		return nil, err
	}
	return cb, nil
}

// checkSSH connects, verifies the host key, authenticates, and disconnects.
func (ch *Checker) checkSSH(ctx context.Context, b *batch, t protocol.CheckTarget) result {
	e := newEndpoint(t, defaultSSHPort)
	files := b.ssh()
	if files.hostKeysErr != nil {
		// The error names the file.
		return result{protocol.CheckHostKeyUnknown, fmt.Sprintf("cannot read known_hosts (%v), so no host key can be verified: fix or remove that file", files.hostKeysErr)}
	}
	user := t.User
	if user == "" {
		user = ch.localUser
	}
	if user == "" {
		return result{protocol.CheckAuthFailed, "the target names no user and the RTE's own user name is unknown: give the host's ansible_user"}
	}

	conn, stop, failed := ch.dial(ctx, b, e)
	if failed != nil {
		return *failed
	}
	defer conn.Close()
	defer stop()

	// OpenSSH matches host names in known_hosts in lower case; knownhosts compares bytes. A
	// port other than 22 is looked up as "[host]:port" by knownhosts itself.
	keyAddr := net.JoinHostPort(strings.ToLower(e.host), strconv.Itoa(e.port))
	var (
		mu      sync.Mutex // the callback runs on x/crypto's key exchange goroutine
		seenKey ssh.PublicKey
		seenErr error
	)
	cfg := &ssh.ClientConfig{
		User:          user,
		Auth:          []ssh.AuthMethod{ssh.PublicKeys(files.signers...)},
		ClientVersion: clientVersion,
		HostKeyCallback: func(hostname string, remote net.Addr, key ssh.PublicKey) error {
			err := files.hostKeys(hostname, remote, key)
			mu.Lock()
			seenKey, seenErr = key, err
			mu.Unlock()
			return err
		},
		HostKeyAlgorithms: ch.hostKeyAlgorithmsFor(files.hostKeys, keyAddr),
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, keyAddr, cfg)
	if err == nil {
		_ = ssh.NewClient(c, chans, reqs).Close() // authenticated: that was the question
		return result{protocol.CheckConnected, fmt.Sprintf("authenticated as %q", user)}
	}

	mu.Lock()
	key, keyErr := seenKey, seenErr
	mu.Unlock()
	hostKeyAccepted := key != nil && keyErr == nil
	switch {
	case keyErr != nil:
		return hostKeyFailure(e, ch.knownHosts, keyAddr, key, keyErr)
	case errors.Is(ctx.Err(), context.Canceled):
		return result{protocol.CheckTimeout, fmt.Sprintf("the check was cancelled during the SSH handshake with %s, most likely because the RTE is stopping", e.addr)}
	case hostKeyAccepted && (ctx.Err() != nil || isTimeout(err)):
		return result{protocol.CheckTimeout, fmt.Sprintf("%s did not finish authenticating user %q within %d ms", e.addr, user, b.timeout.Milliseconds())}
	case hostKeyAccepted && strings.Contains(err.Error(), "unable to authenticate"):
		return authFailed(e, user, ch.sshDir, files)
	case hostKeyAccepted:
		return result{protocol.CheckAuthFailed, fmt.Sprintf("%s closed the connection while user %q was authenticating (%v): see that host's sshd log", e.addr, user, err)}
	case ctx.Err() != nil || isTimeout(err):
		return result{protocol.CheckTimeout, fmt.Sprintf("%s accepted the connection but the SSH handshake did not finish within %d ms: is an SSH server listening on that port?", e.addr, b.timeout.Milliseconds())}
	default:
		return result{protocol.CheckUnreachable, fmt.Sprintf("%s answers but the SSH handshake failed (%v): check that an SSH server listens on that port", e.addr, err)}
	}
}

// hostKeyAlgorithmsFor puts the algorithms of the keys known_hosts has for the host first, so
// that a host known by its ed25519 key is not asked for its ECDSA key (x/crypto's default
// order), which would look like a changed key. Nil keeps x/crypto's default order.
func (ch *Checker) hostKeyAlgorithmsFor(hostKeys ssh.HostKeyCallback, keyAddr string) []string {
	var ke *knownhosts.KeyError
	// The probe key is in no file, so the answer lists every key known for the host.
	err := hostKeys(keyAddr, &net.TCPAddr{IP: net.IPv4zero}, ch.probeKey)
	if !errors.As(err, &ke) || len(ke.Want) == 0 {
		return nil
	}
	var algos []string
	for _, k := range ke.Want {
		if k.Key.Type() == ssh.KeyAlgoRSA {
			// An RSA key signs with SHA-2 where the server can; SHA-1 only for old servers.
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		} else {
			algos = append(algos, k.Key.Type())
		}
	}
	algos = append(algos, hostKeyAlgorithms...)
	var out []string
	for _, a := range algos {
		if slices.Contains(hostKeyAlgorithms, a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// hostKeyFailure turns a host key that known_hosts does not vouch for into an outcome.
func hostKeyFailure(e endpoint, knownHostsPath, keyAddr string, key ssh.PublicKey, err error) result {
	name := knownhosts.Normalize(keyAddr) // as a known_hosts line must name it
	presented := describeKey(key)
	var (
		revoked *knownhosts.RevokedError
		keyErr  *knownhosts.KeyError
	)
	switch {
	case errors.As(err, &revoked):
		return result{protocol.CheckHostKeyMismatch, fmt.Sprintf("%s presented the host key %s, which %s line %d marks as revoked: do not use this host until its key is replaced and verified", name, presented, revoked.Revoked.Filename, revoked.Revoked.Line)}
	case errors.As(err, &keyErr) && len(keyErr.Want) == 0:
		if _, ok := key.(*ssh.Certificate); ok {
			return result{protocol.CheckHostKeyUnknown, fmt.Sprintf("%s is not in %s and presented a host certificate for %s: add an @cert-authority line for its CA, or the host key after verifying it out of band", name, knownHostsPath, presented)}
		}
		return result{protocol.CheckHostKeyUnknown, fmt.Sprintf("%s presented the host key %s, which is not in %s: verify that fingerprint out of band, then add the key (for example with %s)", name, presented, knownHostsPath, keyscan(e))}
	case errors.As(err, &keyErr):
		known := keyErr.Want[0]
		for _, k := range keyErr.Want {
			if k.Key.Type() == underlying(key).Type() {
				known = k
				break
			}
		}
		return result{protocol.CheckHostKeyMismatch, fmt.Sprintf("%s presented the host key %s, but %s line %d has %s for it: this may be an attack or a reinstalled host; verify the new key out of band before replacing that line", name, presented, known.Filename, known.Line, describeKey(known.Key))}
	default:
		// x/crypto's certificate checks: a certificate whose CA is not trusted for the host,
		// expired, or for another name.
		return result{protocol.CheckHostKeyUnknown, fmt.Sprintf("%s presented the host key %s, which %s does not vouch for (%v): verify it out of band and add it", name, presented, knownHostsPath, err)}
	}
}

// describeKey names a key by type and SHA256 fingerprint, never by its bytes.
func describeKey(key ssh.PublicKey) string {
	k := underlying(key)
	return k.Type() + " " + ssh.FingerprintSHA256(k)
}

// underlying is the key a certificate certifies, or key itself: ssh-keyscan and sshd's logs
// show that key's fingerprint.
func underlying(key ssh.PublicKey) ssh.PublicKey {
	if cert, ok := key.(*ssh.Certificate); ok {
		return cert.Key
	}
	return key
}

func keyscan(e endpoint) string {
	if e.port == defaultSSHPort {
		return "ssh-keyscan " + e.host
	}
	return fmt.Sprintf("ssh-keyscan -p %d %s", e.port, e.host)
}

func authFailed(e endpoint, user, sshDir string, files *sshFiles) result {
	if len(files.signers) == 0 {
		var skipped string
		if len(files.skipped) > 0 {
			skipped = "; skipped " + strings.Join(files.skipped, ", ")
		}
		return result{protocol.CheckAuthFailed, fmt.Sprintf("no usable private key in %s (looked for %s%s): add an unencrypted key whose public half is in %q's authorized_keys on %s", sshDir, strings.Join(keyFiles, ", "), skipped, user, e.addr)}
	}
	return result{protocol.CheckAuthFailed, fmt.Sprintf("%s refused user %q with every key the RTE offered (%s): add the RTE's public key to that user's authorized_keys, or check the user name", e.addr, user, strings.Join(files.keyTypes, ", "))}
}
