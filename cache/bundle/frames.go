package bundle

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
)

// zstd frame layout (RFC 8878 section 3.1), as much as is needed to find where each frame
// ends without decompressing it.
const (
	zstdMagic          = 0xFD2FB528
	skippableMagicMask = 0xFFFFFFF0
	skippableMagic     = 0x184D2A50
)

// ScanFrames walks the zstd frames of a bundle read from r and returns each one's offset, size
// and SHA-256, at most maxFrames of them (0: no limit). It decompresses nothing: it reads the
// frame and block headers and hashes the bytes. Any zstd stream has at least one frame, so a
// bundle packed before frames were cut is one frame; a stream that is not zstd, or is
// truncated, is an error.
//
// Hand-written: klauspost/compress/zstd decodes a frame header (zstd.Header) but has no way to
// skip a frame without decoding it, and decoding a whole bundle to find its frames would cost
// as much as unpacking it.
func ScanFrames(r io.Reader, maxFrames int) ([]Frame, error) {
	br := bufio.NewReaderSize(r, 128<<10)
	s := &frameScanner{r: br}
	var frames []Frame
	for {
		if _, err := br.Peek(1); errors.Is(err, io.EOF) {
			break
		}
		if maxFrames > 0 && len(frames) == maxFrames {
			return nil, fmt.Errorf("bundle has more than %d zstd frames", maxFrames)
		}
		start := s.off
		s.h = sha256.New()
		if err := s.frame(); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("zstd frame %d at offset %d: %w", len(frames), start, err)
		}
		f := Frame{Offset: start, Size: s.off - start}
		s.h.Sum(f.Hash[:0])
		frames = append(frames, f)
	}
	if len(frames) == 0 {
		return nil, errors.New("bundle is empty: not a zstd stream")
	}
	return frames, nil
}

type frameScanner struct {
	r   *bufio.Reader
	off int64
	h   hash.Hash
	buf [14]byte
}

// read consumes exactly n bytes (n <= 14) into s.buf, hashing them.
func (s *frameScanner) read(n int) ([]byte, error) {
	b := s.buf[:n]
	if _, err := io.ReadFull(s.r, b); err != nil {
		return nil, err
	}
	s.h.Write(b)
	s.off += int64(n)
	return b, nil
}

// skip consumes n bytes, hashing them.
func (s *frameScanner) skip(n int64) error {
	m, err := io.CopyN(s.h, s.r, n)
	s.off += m
	if err != nil {
		return err
	}
	return nil
}

func (s *frameScanner) frame() error {
	b, err := s.read(4)
	if err != nil {
		return err
	}
	magic := binary.LittleEndian.Uint32(b)
	if magic&skippableMagicMask == skippableMagic {
		b, err := s.read(4)
		if err != nil {
			return err
		}
		return s.skip(int64(binary.LittleEndian.Uint32(b)))
	}
	if magic != zstdMagic {
		return fmt.Errorf("starts with 0x%08x, not the zstd magic number", magic)
	}
	b, err = s.read(1)
	if err != nil {
		return err
	}
	fhd := b[0]
	if fhd&0x08 != 0 {
		return errors.New("the frame header's reserved bit is set")
	}
	single := fhd&0x20 != 0
	checksum := fhd&0x04 != 0
	n := [4]int{0, 1, 2, 4}[fhd&0x03] // dictionary id
	switch fhd >> 6 {                 // frame content size
	case 0:
		if single {
			n++
		}
	case 1:
		n += 2
	case 2:
		n += 4
	case 3:
		n += 8
	}
	if !single {
		n++ // window descriptor
	}
	if _, err := s.read(n); err != nil {
		return err
	}
	for {
		b, err := s.read(3)
		if err != nil {
			return err
		}
		hdr := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16
		last := hdr&1 != 0
		size := int64(hdr >> 3)
		switch (hdr >> 1) & 3 {
		case 0, 2: // raw, compressed
		case 1: // RLE: one byte repeated size times
			size = 1
		default:
			return errors.New("a block of the reserved type 3")
		}
		if err := s.skip(size); err != nil {
			return err
		}
		if last {
			break
		}
	}
	if checksum {
		_, err = s.read(4)
	}
	return err
}
