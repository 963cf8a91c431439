package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/rte-project/rte/internal/atomicfile"
	"go.uber.org/zap"
)

// openDir creates, checks and locks the directory.
func (s *Spool) openDir() error {
	created := false
	if _, err := os.Stat(s.dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			return fmt.Errorf("create spool directory %s: %w", s.dir, err)
		}
		created = true
	}
	info, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("open spool directory %s: %w", s.dir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("spool path %s is not a directory: point RTE_SPOOL_PATH at a directory", s.dir)
	}
	if info.Mode().Perm()&0o077 != 0 {
		s.log.Warn("spool directory is open to its group or others; records hold job output, so make it 0700",
			zap.String("dir", s.dir), zap.String("mode", info.Mode().Perm().String()))
	}
	lockPath := filepath.Join(s.dir, "LOCK")
	lf, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open spool lock %s: %w", lockPath, err)
	}
	s.lockFile = lf
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("spool %s is in use by another process: give each RTE its own RTE_SPOOL_PATH", s.dir)
		}
		return fmt.Errorf("lock spool %s: %w", lockPath, err)
	}
	df, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("open spool directory %s: %w", s.dir, err)
	}
	s.dirFile = df
	if created {
		// The new directory's own entry lives in its parent; without this a power loss can
		// take the directory, and every file in it, away.
		if err := s.syncPath(filepath.Dir(filepath.Clean(s.dir))); err != nil {
			return err
		}
	}
	return nil
}

func (s *Spool) closeDir() {
	if s.dirFile != nil {
		s.dirFile.Close()
	}
	if s.lockFile != nil {
		s.lockFile.Close() // closing the last descriptor releases the flock
	}
}

func (s *Spool) syncPath(path string) error {
	if s.noSync {
		return nil
	}
	s.syncs.Add(1)
	return atomicfile.SyncDir(path)
}

func (s *Spool) syncDir() error {
	if s.noSync {
		return nil
	}
	s.syncs.Add(1)
	if err := s.fsync(s.dirFile); err != nil {
		return fmt.Errorf("sync spool directory %s: %w", s.dir, err)
	}
	return nil
}
