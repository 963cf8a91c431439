package spool

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/rte-project/rte/protocol"
)

// fileHeader starts every job file. It is readable text so that `head -c 12` tells an operator
// what the file is; the digit is the format version.
const fileHeader = "RTE spool 1\n"

// frameHeaderLen is the length and checksum in front of each payload.
const frameHeaderLen = 8

// maxPayload bounds a frame's length field: a record larger than one text frame could never
// be sent, so a larger length can only be damage.
const maxPayload = protocol.MaxMessageBytes

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// fileExt names job files; anything else in the directory is not the spool's.
const fileExt = ".spool"

// frameChecksum covers the length bytes too, so a damaged length that happens to point at a
// plausible payload is still caught.
func frameChecksum(lengthBytes, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(lengthBytes, castagnoli), castagnoli, payload)
}

// appendFrame encodes payload as one frame at the end of dst.
func appendFrame(dst, payload []byte) []byte {
	var h [frameHeaderLen]byte
	binary.BigEndian.PutUint32(h[0:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(h[4:8], frameChecksum(h[0:4], payload))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// damage is a frame that cannot be trusted: what came before it is good, it and everything
// after it are not.
type damage struct{ reason string }

func (d *damage) Error() string { return d.reason }

// readFrame reads one frame from r, of which at most left bytes belong to the file. buf is
// reused for the payload when it is large enough. It returns io.EOF at a clean end, a *damage
// for a torn or corrupt frame, and any other error for a failed read.
func readFrame(r *bufio.Reader, left int64, buf []byte) ([]byte, error) {
	if left == 0 {
		return nil, io.EOF
	}
	if left < frameHeaderLen {
		return nil, &damage{fmt.Sprintf("frame header cut short (%d of %d bytes)", left, frameHeaderLen)}
	}
	var h [frameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, readErr(err)
	}
	n := int64(binary.BigEndian.Uint32(h[0:4]))
	if n == 0 || n > maxPayload {
		return nil, &damage{fmt.Sprintf("frame length %d is outside 1 to %d", n, maxPayload)}
	}
	if n > left-frameHeaderLen {
		return nil, &damage{fmt.Sprintf("payload cut short (%d of %d bytes)", left-frameHeaderLen, n)}
	}
	if int64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	payload := buf[:n]
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, readErr(err)
	}
	if frameChecksum(h[0:4], payload) != binary.BigEndian.Uint32(h[4:8]) {
		return nil, &damage{"checksum mismatch"}
	}
	return payload, nil
}

// readErr turns a short read inside the known file size into damage: the file shrank under us
// or the size was wrong, and either way the frame is not whole.
func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &damage{"file ended inside a frame"}
	}
	return err
}

// decodeRecord checks all of payload, as Open's scan does for every frame: it must be a valid
// record message of job with the given seq.
func decodeRecord(payload []byte, job string, seq int64) (protocol.Record, error) {
	m, err := protocol.Decode(payload)
	if err != nil {
		return protocol.Record{}, &damage{"payload is not a valid record: " + protocol.PeerText(err.Error(), 200)}
	}
	rec, ok := m.(*protocol.Record)
	if !ok {
		return protocol.Record{}, &damage{fmt.Sprintf("payload is a %s message, not a record", m.Type())}
	}
	return *rec, checkPlace(*rec, job, seq)
}

func checkPlace(rec protocol.Record, job string, seq int64) error {
	if rec.Job != job {
		return &damage{fmt.Sprintf("record of job %q in the file of job %q", protocol.PeerText(rec.Job, 128), job)}
	}
	if rec.Seq != seq {
		return &damage{fmt.Sprintf("seq %d where %d was due", rec.Seq, seq)}
	}
	return nil
}

// dataKey precedes a record's data, its last key as protocol.Encode writes it. Nothing before
// it can contain the string: job ids, kinds and times have no quotes.
var dataKey = []byte(`,"data":`)

// envelope is Pending's cheap read of a payload: it decodes the keys before the data and takes
// the data as it stands, without scanning it. That is sound because the payload's checksum
// matches, and its JSON was checked in full when it was written and again by Open. A payload
// laid out otherwise gets the full decode.
func envelope(payload []byte, job string, seq int64) (protocol.Record, error) {
	i := bytes.Index(payload, dataKey)
	data := payload[min(i+len(dataKey), len(payload)):max(len(payload)-1, 0)]
	if i < 0 || len(data) < 2 || data[0] != '{' || payload[len(payload)-1] != '}' {
		return decodeRecord(payload, job, seq)
	}
	var head struct {
		Type string `json:"type"`
		protocol.Record
	}
	if err := json.Unmarshal(append(payload[:i:i], '}'), &head); err != nil || head.Type != protocol.TypeRecord {
		return decodeRecord(payload, job, seq)
	}
	head.Data = data
	return head.Record, checkPlace(head.Record, job, seq)
}

// newFileReader reads n bytes of f from off, buffered, without moving f's own offset.
func newFileReader(f *os.File, off, n int64) *bufio.Reader {
	return bufio.NewReaderSize(io.NewSectionReader(f, off, n), 128<<10)
}
