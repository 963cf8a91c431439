package chaos

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// spoolHeader starts every spool file (docs/spool.md, "File format").
const spoolHeader = "RTE spool 1\n"

// spoolHighWater reads the job files in an RTE's spool directory, from outside the RTE, and
// returns each job's last whole record's seq: what the app must store for the fault to count
// as recovered. It reads the format docs/spool.md documents rather than importing jobs/spool,
// whose Open takes the directory's lock, which the running RTE holds; the checksum is not
// checked, since a torn tail only makes the target lower and the RTE cuts it at its start.
func spoolHighWater(dir string) (map[string]int64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, e := range entries {
		job, ok := strings.CutSuffix(e.Name(), ".spool")
		if !ok || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // acknowledged and removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		if seq := lastSeq(b); seq > 0 {
			out[job] = seq
		}
	}
	return out, nil
}

// lastSeq is the seq of the last whole frame of a spool file's bytes, 0 when there is none.
func lastSeq(b []byte) int64 {
	if !strings.HasPrefix(string(b[:min(len(b), len(spoolHeader))]), spoolHeader) {
		return 0
	}
	b = b[len(spoolHeader):]
	var last int64
	for len(b) >= 8 {
		n := int(binary.BigEndian.Uint32(b))
		if n <= 0 || len(b) < 8+n {
			break
		}
		var rec struct {
			Seq int64 `json:"seq"`
		}
		if json.Unmarshal(b[8:8+n], &rec) == nil && rec.Seq > last {
			last = rec.Seq
		}
		b = b[8+n:]
	}
	return last
}
