package spool_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

const header = "RTE spool 1\n"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frame encodes payload the way the package doc describes.
func frame(payload []byte) []byte {
	out := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	crc := crc32.Update(crc32.Checksum(out, castagnoli), castagnoli, payload)
	out = binary.BigEndian.AppendUint32(out, crc)
	return append(out, payload...)
}

// FuzzOpen feeds arbitrary bytes to the recovery scan as the body of a job file. With reframe,
// the bytes are split at newlines into payloads that get correct frames, so the fuzzer reaches
// the record checks behind the checksum. Open must not fail or panic, and every record it then
// gives back must be a whole frame of the input, checksum intact, in seq order.
func FuzzOpen(f *testing.F) {
	var valid []byte
	for _, p := range []string{
		`{"type":"record","job":"j","seq":1,"kind":"start","at":"2026-12-02T10:00:00Z","data":{"pid":1}}`,
		`{"type":"record","job":"j","seq":2,"kind":"output","at":"2026-12-02T10:00:00.5Z","data":{"text":"hi\n"}}`,
		`{"type":"record","job":"j","seq":3,"kind":"end","at":"2026-12-02T10:00:01Z","data":{"status":"success","exit_code":0}}`,
	} {
		valid = append(valid, frame([]byte(p))...)
		f.Add(valid, false)
		f.Add([]byte(p), true)
	}
	f.Add(valid[:len(valid)-7], false)
	flipped := bytes.Clone(valid)
	flipped[30] ^= 1
	f.Add(flipped, false)
	f.Add([]byte{}, false)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, false)
	f.Add([]byte("{\"type\":\"record\",\"job\":\"k\",\"seq\":1,\"kind\":\"log\",\"at\":\"x\",\"data\":{}}\n{}"), true)

	f.Fuzz(func(t *testing.T, body []byte, reframe bool) {
		if reframe {
			var framed []byte
			for p := range bytes.SplitSeq(body, []byte("\n")) {
				if len(p) > 0 {
					framed = append(framed, frame(p)...)
				}
			}
			body = framed
		}
		dir := t.TempDir()
		path := filepath.Join(dir, "j.spool")
		if err := os.WriteFile(path, append([]byte(header), body...), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := spool.Open(dir, spool.Options{NoSync: true})
		if err != nil {
			t.Fatalf("Open of a file with a good header: %v, want the damage cut and no error", err)
		}
		defer s.Close()

		off := 0
		var n int64
		err = s.Pending("j", 0, func(rec protocol.Record, got []byte) error {
			n++
			want := frame(got)
			if rec.Seq != n || rec.Job != "j" {
				t.Fatalf("record %d of the walk is seq %d of job %q", n, rec.Seq, rec.Job)
			}
			if off+len(want) > len(body) || !bytes.Equal(body[off:off+len(want)], want) {
				t.Fatalf("record %d is not the whole, checksummed frame at offset %d of the input", n, off)
			}
			off += len(want)
			return nil
		})
		if err != nil {
			t.Fatalf("Pending after Open: %v", err)
		}
		jobs := s.Jobs()
		if n == 0 && len(jobs) != 0 || n > 0 && (len(jobs) != 1 || jobs[0].LastSeq != n) {
			t.Fatalf("Jobs = %+v after %d records were read back", jobs, n)
		}
		info, err := os.Stat(path)
		switch {
		case n == 0 && err == nil:
			t.Fatalf("a file with no good record was kept (%d bytes)", info.Size())
		case n > 0 && (err != nil || info.Size() != int64(len(header)+off)):
			t.Fatalf("file after Open: %v, size %d, want the %d bytes up to the last good frame", err, info.Size(), len(header)+off)
		}
	})
}
