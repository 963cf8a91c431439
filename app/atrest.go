package app

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// A job's secrets are needed wherever its job.start is sent, and with several app nodes that is
// the node holding the runner's socket, not always the one that took the submit. With a secret
// key (Config.SecretKey, the same on every node), Submit stores the secrets sealed beside the
// job, and the dispatching node opens them; the store keeps them only until the runner has the
// job. Without a key they stay in the submitting node's memory, and a job with secrets for a
// runner another node holds is refused at submit, saying so.

// MinSecretKeyLength is the shortest Config.SecretKey accepted: 32 characters, such as the 64
// hex digits of `openssl rand -hex 32`, carry the 256 bits the key is derived to.
const MinSecretKeyLength = 32

// atRestInfo binds the derived key to this use, so the same secret key yields other keys
// elsewhere.
const atRestInfo = "rte-app job secrets at rest v1"

// atRestPrefix starts every value sealed at rest, naming the format so a later one can differ.
const atRestPrefix = "v1:"

// newAtRest derives the AES-256-GCM key that seals job secrets at rest from the app's secret
// key: HKDF-SHA256 with no salt, since the key is already secret and random.
func newAtRest(secretKey string) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(secretKey), nil, atRestInfo, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// atRestAD is the additional data of one sealed secret: a value copied into another job's row,
// or under another name, does not open.
func atRestAD(job, name string) []byte { return []byte(job + "\x00" + name) }

// sealForStore returns the secrets sealed for the store (nil without a secret key or secrets).
// Without a key, a job with secrets for a runner whose socket another node holds is refused:
// that node could never read them.
func (a *App) sealForStore(job string, runner *Runner, plain map[string]string) (map[string]string, error) {
	if len(plain) == 0 {
		return nil, nil
	}
	if a.atRest == nil {
		if l, ok := a.elsewhere(runner.Name); ok {
			return nil, refusal(runner, nil, "runner %q's socket is held by app node %q, and this node (%q) keeps job secrets in its memory only, where node %q cannot read them: give every app node the same secret key (APP_SECRET_KEY) so that secrets are stored sealed, or submit the job on node %q",
				runner.Name, l.Node, a.cfg.Node, l.Node, l.Node)
		}
		return nil, nil
	}
	sealed := make(map[string]string, len(plain))
	for name, value := range plain {
		nonce := make([]byte, a.atRest.NonceSize())
		_, _ = rand.Read(nonce) // crypto/rand.Read never fails (Go 1.24+)
		ct := a.atRest.Seal(nonce, nonce, []byte(value), atRestAD(job, name))
		sealed[name] = atRestPrefix + base64.StdEncoding.EncodeToString(ct)
	}
	return sealed, nil
}

// errAtRestOpen never says more, so a wrong key and a changed value look alike.
var errAtRestOpen = errors.New("sealed secret does not open")

func (a *App) openAtRest(job, name, sealed string) (string, error) {
	rest, ok := strings.CutPrefix(sealed, atRestPrefix)
	if !ok {
		return "", errAtRestOpen
	}
	raw, err := base64.StdEncoding.DecodeString(rest)
	if err != nil || len(raw) < a.atRest.NonceSize()+a.atRest.Overhead() {
		return "", errAtRestOpen
	}
	n := a.atRest.NonceSize()
	plain, err := a.atRest.Open(nil, raw[:n], raw[n:], atRestAD(job, name))
	if err != nil {
		return "", errAtRestOpen
	}
	return string(plain), nil
}

// secretsOf returns the plaintext secrets of j: from this process's memory when it took the
// submit, else opened from the copy sealed in the store. When they cannot be had, why says what
// happened and what to do, for the message the job ends with.
func (a *App) secretsOf(j *Job) (plain map[string]string, why string) {
	if plain, ok := a.heldSecrets(j.ID); ok {
		return plain, ""
	}
	if j.SealedSecrets != nil {
		if a.atRest == nil {
			return nil, fmt.Sprintf("its secrets (%v) were stored sealed with the secret key of app node %q, and this node (%q) has none: give every app node the same secret key (APP_SECRET_KEY), then submit the job again",
				j.SecretNames, j.SubmitNode, a.cfg.Node)
		}
		plain = make(map[string]string, len(j.SecretNames))
		for _, name := range j.SecretNames {
			sealed, ok := j.SealedSecrets[name]
			if !ok {
				return nil, fmt.Sprintf("its secret %s is missing from the sealed copy in the store: submit the job again", name)
			}
			v, err := a.openAtRest(j.ID, name, sealed)
			if err != nil {
				return nil, fmt.Sprintf("its secrets (%v) do not open with this app node's secret key (%q sealed them): give every app node the same secret key (APP_SECRET_KEY), then submit the job again",
					j.SecretNames, j.SubmitNode)
			}
			plain[name] = v
		}
		return plain, ""
	}
	if j.SubmitNode != "" && j.SubmitNode != a.cfg.Node {
		return nil, fmt.Sprintf("its secrets (%v) were kept only in the memory of app node %q, which took the submit, and this node (%q) holds the runner's socket: give every app node the same secret key (APP_SECRET_KEY) so that secrets are stored sealed, and submit the job again",
			j.SecretNames, j.SubmitNode, a.cfg.Node)
	}
	return nil, fmt.Sprintf("its secrets (%v) were kept only in the app's memory and the app restarted before the runner had the job: submit it again", j.SecretNames)
}
