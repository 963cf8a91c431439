package spool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Defaults of Options.
const (
	defaultRetryEvery = 5 * time.Second
	// probeBytes is the size of Healthy's test write: one full output record, so "healthy"
	// means the next batch of output fits.
	probeBytes = 64<<10 + 512
	probeName  = "probe.tmp"
)

// healthState is the last write or sync error and when Healthy last tried a test write.
type healthState struct {
	mu         sync.Mutex // guards err and lastProbe; no other lock is taken while it is held
	err        error
	lastProbe  time.Time
	retryEvery time.Duration // set by Open
}

// Healthy returns nil, or the last write or sync error while the spool cannot be written. While
// it reports an error it tries a test write of one record's size (a file probe.tmp, removed at
// once) every Options.RetryEvery at most, starting RetryEvery after the error, and turns healthy when that succeeds, so the spool
// heals once space is freed even if nothing is appended. The test write blocks the caller for
// the write and a sync.
func (s *Spool) Healthy() error {
	s.healthState.mu.Lock()
	err := s.healthState.err
	due := err != nil && time.Since(s.lastProbe) >= s.retryEvery
	if due {
		s.lastProbe = time.Now()
	}
	s.healthState.mu.Unlock()
	if !due {
		return err
	}
	s.jobTable.mu.Lock()
	closed := s.closed
	s.jobTable.mu.Unlock()
	if closed {
		return err
	}
	err = s.probe()
	s.setHealth(err)
	return err
}

// probe writes and syncs a file of one record's size, and removes it.
func (s *Spool) probe() error {
	path := filepath.Join(s.dir, probeName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return s.explain(fmt.Errorf("test write to spool: %w", err))
	}
	_, err = f.Write(make([]byte, probeBytes))
	if err == nil && !s.noSync {
		s.syncs.Add(1)
		err = s.fsync(f)
	}
	f.Close()
	os.Remove(path)
	if err != nil {
		return s.explain(fmt.Errorf("test write to spool: %w", err))
	}
	return nil
}

func (s *Spool) setHealth(err error) {
	s.healthState.mu.Lock()
	prev := s.healthState.err
	s.healthState.err = err
	if err != nil && prev == nil {
		s.lastProbe = time.Now() // report a new error for a while before a test write may clear it
	}
	s.healthState.mu.Unlock()
	switch {
	case err != nil && prev == nil:
		s.log.Error("spool cannot be written", zap.String("dir", s.dir), zap.Error(err))
	case err == nil && prev != nil:
		s.log.Info("spool can be written again", zap.String("dir", s.dir))
	}
}

// explain adds what to do to a full-disk error. The wrapped *os.PathError names the file.
func (s *Spool) explain(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("spool %s is full, free space or grow its volume: %w", s.dir, err)
	}
	return err
}
