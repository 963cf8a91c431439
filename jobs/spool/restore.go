package spool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rte-project/rte/protocol"
	"go.uber.org/zap"
)

// restore loads every job file in the directory.
func (s *Spool) restore() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("read spool directory %s: %w", s.dir, err)
	}
	dirChanged := false
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || filepath.Ext(name) != fileExt {
			continue
		}
		id := name[:len(name)-len(fileExt)]
		if !protocol.ValidJobID(id) {
			s.log.Warn("ignoring a file whose name is not a job id", zap.String("file", filepath.Join(s.dir, name)))
			continue
		}
		j, changed, err := s.restoreJob(id)
		if err != nil {
			return err
		}
		dirChanged = dirChanged || changed
		if j != nil {
			s.jobs[id] = j
		}
	}
	if dirChanged {
		return s.syncDir()
	}
	return nil
}

// restoreJob scans one job file, cutting a damaged tail. It returns nil for a file that held no
// record (a crash right after creating it), which it removes; changed reports a removal.
func (s *Spool) restoreJob(id string) (j *job, changed bool, err error) {
	path := filepath.Join(s.dir, id+fileExt)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, false, fmt.Errorf("open spool file %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("stat spool file %s: %w", path, err)
	}
	j = &job{id: id, path: path, f: f, index: index{base: 1}}
	if err := s.scan(j, info.Size()); err != nil {
		f.Close()
		return nil, false, err
	}
	if j.lastSeq == 0 {
		f.Close()
		if err := os.Remove(path); err != nil {
			return nil, false, fmt.Errorf("remove empty spool file %s: %w", path, err)
		}
		s.log.Info("removed a spool file that held no record (the RTE stopped while creating it)", zap.String("file", path))
		return nil, true, nil
	}
	j.durableSeq, j.durableSize = j.lastSeq, j.size
	if j.endSeq != 0 {
		j.closeEnded()
	}
	return j, false, nil
}

// scan reads j's file of the given size, filling j's index, and cuts the file at the first
// damaged frame.
func (s *Spool) scan(j *job, size int64) error {
	hdr := make([]byte, len(fileHeader))
	n, err := j.f.ReadAt(hdr, 0)
	if err != nil && n < len(hdr) && int64(n) < size {
		return fmt.Errorf("read spool file %s: %w", j.path, err)
	}
	if size < int64(len(fileHeader)) {
		if string(hdr[:n]) == fileHeader[:n] {
			return nil // a torn header: no record was ever written
		}
		return fmt.Errorf("spool file %s does not start with %q: it is not a spool file, move it out of %s", j.path, fileHeader, s.dir)
	}
	if string(hdr) != fileHeader {
		return fmt.Errorf("spool file %s does not start with %q: it is not a spool file of this version, move it out of %s", j.path, fileHeader, s.dir)
	}
	off := int64(len(fileHeader))
	r := newFileReader(j.f, off, size-off)
	var buf []byte
	var bad error
	for {
		payload, err := readFrame(r, size-off, buf)
		if errors.Is(err, io.EOF) {
			break
		}
		var d *damage
		if errors.As(err, &d) {
			bad = d
			break
		}
		if err != nil {
			return fmt.Errorf("read spool file %s at offset %d: %w", j.path, off, err)
		}
		buf = payload[:0]
		if j.endSeq != 0 {
			bad = &damage{"a frame follows the end record"}
			break
		}
		rec, err := decodeRecord(payload, j.id, j.lastSeq+1)
		if err != nil {
			bad = err
			break
		}
		j.offs = append(j.offs, off)
		j.ats = append(j.ats, rec.At)
		j.lastSeq = rec.Seq
		if rec.Kind == protocol.KindEnd {
			j.endSeq = rec.Seq
		}
		off += frameHeaderLen + int64(len(payload))
	}
	j.size = off
	if bad == nil {
		return nil
	}
	s.log.Warn("cut a damaged tail off a spool file (the RTE or the machine stopped mid-write)",
		zap.String("file", j.path), zap.Int64("offset", off), zap.Int64("dropped_bytes", size-off),
		zap.Int64("kept_records", j.lastSeq), zap.String("reason", bad.Error()))
	if err := j.f.Truncate(off); err != nil {
		return fmt.Errorf("cut damaged tail of spool file %s at offset %d: %w", j.path, off, err)
	}
	if !s.noSync {
		s.syncs.Add(1)
		if err := s.fsync(j.f); err != nil {
			return fmt.Errorf("sync spool file %s: %w", j.path, err)
		}
	}
	return nil
}
