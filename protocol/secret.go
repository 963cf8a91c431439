package protocol

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// secretInfo binds the key to this use, so the same token never yields the same key elsewhere.
const secretInfo = "rte.v1 secrets"

// secretKey derives the per-job key: HKDF-SHA256(ikm=token, salt=job id, info="rte.v1 secrets").
// The job id as salt means a sealed value replayed into another job does not open.
func secretKey(token, job string) ([]byte, error) {
	return hkdf.Key(sha256.New, []byte(token), []byte(job), secretInfo, 32)
}

// SealSecret seals plaintext for job with the RTE's token: base64(nonce(12) || AES-256-GCM).
func SealSecret(token, job, plaintext string) (string, error) {
	key, err := secretKey(token, job)
	if err != nil {
		return "", err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return "", err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(gcm.Seal(nonce, nonce, []byte(plaintext), nil)), nil
}

// ErrSecretOpen is returned for any sealed value that does not open; it never says more, so a
// wrong token and a tampered value look the same to whoever reads the error.
var ErrSecretOpen = errors.New("sealed secret does not open: the app sealed it with another token or job id, or it was changed")

// OpenSecret opens a value sealed by SealSecret.
func OpenSecret(token, job, sealed string) (string, error) {
	raw, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil {
		return "", fmt.Errorf("sealed secret is not standard padded base64: %w", err)
	}
	key, err := secretKey(token, job)
	if err != nil {
		return "", err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return "", err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return "", err
	}
	if len(raw) < gcm.NonceSize()+gcm.Overhead() {
		return "", ErrSecretOpen
	}
	plain, err := gcm.Open(nil, raw[:gcm.NonceSize()], raw[gcm.NonceSize():], nil)
	if err != nil {
		return "", ErrSecretOpen
	}
	return string(plain), nil
}
