package protocol

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// ChunkTag is the first byte of a binary bundle frame; other values are reserved.
const ChunkTag = 0x01

// chunkHeader is tag(1) + raw sha256(32) + big-endian offset(8).
const chunkHeader = 1 + 32 + 8

// Chunk is one binary frame of a bundle being sent.
type Chunk struct {
	Hash    [32]byte
	Offset  uint64
	Payload []byte // aliases the frame it was decoded from
}

// HashName is the chunk's bundle name, "sha256:<hex>".
func (c Chunk) HashName() string { return "sha256:" + hex.EncodeToString(c.Hash[:]) }

// EncodeChunk builds the frame 0x01 | hash | offset | payload.
func EncodeChunk(hash [32]byte, offset uint64, payload []byte) ([]byte, error) {
	if len(payload) > MaxChunkPayload {
		return nil, fmt.Errorf("chunk payload is %d bytes, the limit is %d", len(payload), MaxChunkPayload)
	}
	f := make([]byte, chunkHeader+len(payload))
	f[0] = ChunkTag
	copy(f[1:33], hash[:])
	binary.BigEndian.PutUint64(f[33:41], offset)
	copy(f[41:], payload)
	return f, nil
}

// DecodeChunk parses a binary frame.
func DecodeChunk(frame []byte) (Chunk, error) {
	var c Chunk
	if len(frame) < chunkHeader {
		return c, fmt.Errorf("binary frame of %d bytes is shorter than the %d-byte chunk header", len(frame), chunkHeader)
	}
	if frame[0] != ChunkTag {
		return c, fmt.Errorf("binary frame starts with 0x%02x, want 0x%02x", frame[0], ChunkTag)
	}
	if n := len(frame) - chunkHeader; n > MaxChunkPayload {
		return c, fmt.Errorf("chunk payload is %d bytes, the limit is %d", n, MaxChunkPayload)
	}
	copy(c.Hash[:], frame[1:33])
	c.Offset = binary.BigEndian.Uint64(frame[33:41])
	c.Payload = frame[41:]
	return c, nil
}

// ParseHash turns "sha256:<hex>" into its raw bytes.
func ParseHash(h string) ([32]byte, error) {
	var out [32]byte
	if !ValidHash(h) {
		return out, fmt.Errorf("bundle hash %q is not sha256: and 64 lowercase hex digits", clip(h, 80))
	}
	_, err := hex.Decode(out[:], []byte(h[len("sha256:"):]))
	return out, err
}
