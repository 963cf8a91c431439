package jobs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rte-project/rte/internal/atomicfile"
	"github.com/rte-project/rte/protocol"
)

// Bounds of the ran-jobs ledger.
const (
	// RanRetention is how long the RTE remembers that a job id ran here, so that a job.start
	// replayed after the app acknowledged the job's end is refused (already_ran) instead of
	// run a second time. Seven days covers any reconnect or replay of the app's outbox; an
	// app that reuses an id after that runs it again.
	RanRetention = 7 * 24 * time.Hour
	// MaxRan bounds the ids remembered: past it the oldest are forgotten first. At about 60
	// bytes a line the file stays under 6 MiB.
	MaxRan = 100_000
)

// ledgerHeader starts a ledger file; a file without it is not read, so a wrong
// RanLedger path never feeds the RTE lines it did not write.
const ledgerHeader = "rte ran-jobs v1\n"

// ledger remembers the ids of jobs that ran here, with when they ended, for RanRetention and
// across restarts. On disk it is one line per job, "<unix seconds> <job id>", appended and
// synced when a job ends, and rewritten (temp file, sync, rename, sync the directory) at open
// and whenever dead lines outnumber live ones. An empty path keeps it in memory only. It is
// safe for concurrent use.
type ledger struct {
	path string
	log  *zap.Logger
	now  func() time.Time

	mu    sync.Mutex
	ended map[string]time.Time
	order []string // ids in the order they were added, oldest first; may hold stale ids
	lines int      // lines in the file since it was last rewritten
}

// openLedger reads path (a missing file is an empty ledger), drops what is older than
// RanRetention, and rewrites it.
func openLedger(path string, log *zap.Logger, now func() time.Time) (*ledger, error) {
	l := &ledger{path: path, log: log, now: now, ended: map[string]time.Time{}}
	if path == "" {
		return l, nil
	}
	if err := l.read(); err != nil {
		return nil, err
	}
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *ledger) read() error {
	f, err := os.Open(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open ran-jobs ledger %s: %w", l.path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() || sc.Text()+"\n" != ledgerHeader {
		return fmt.Errorf("ran-jobs ledger %s does not start with %q: it was not written by the RTE; move it away", l.path, strings.TrimSpace(ledgerHeader))
	}
	bad := 0
	cutoff := l.now().Add(-RanRetention)
	for sc.Scan() {
		secs, id, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(secs, 10, 64)
		if !ok || err != nil || !protocol.ValidJobID(id) {
			bad++ // a torn last line after a crash; the rest is still good
			continue
		}
		if at := time.Unix(n, 0); at.After(cutoff) {
			l.remember(id, at)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read ran-jobs ledger %s: %w", l.path, err)
	}
	if bad > 0 {
		l.log.Warn("ran-jobs ledger had unreadable lines; they were dropped", zap.String("path", l.path), zap.Int("lines", bad))
	}
	return nil
}

// remember records id in memory, forgetting the oldest past MaxRan. l.mu is held or l is
// not shared yet.
func (l *ledger) remember(id string, at time.Time) {
	if _, ok := l.ended[id]; !ok {
		l.order = append(l.order, id)
	}
	l.ended[id] = at
	for len(l.ended) > MaxRan {
		delete(l.ended, l.order[0])
		l.order = l.order[1:]
	}
	if len(l.order) > 2*MaxRan {
		l.order = append([]string(nil), l.order[len(l.order)-len(l.ended):]...)
	}
}

// ran reports whether id ended here within RanRetention, and when.
func (l *ledger) ran(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.ended[id]
	if !ok || l.now().Sub(at) > RanRetention {
		return time.Time{}, false
	}
	return at, true
}

// add remembers that id ended now, and writes it down. A write that fails is returned; id is
// still remembered until the RTE stops.
func (l *ledger) add(id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := l.now()
	l.remember(id, at)
	if l.path == "" {
		return nil
	}
	if l.lines > 2*len(l.ended)+1000 {
		return l.rewriteLocked() // the rewrite writes id too
	}
	// Opened per job end rather than kept open: the Manager has no Close, and one open per
	// job costs nothing beside the job.
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open ran-jobs ledger %s: %w", l.path, err)
	}
	_, err = fmt.Fprintf(f, "%d %s\n", at.Unix(), id)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write ran-jobs ledger %s: %w", l.path, err)
	}
	l.lines++
	return nil
}

func (l *ledger) rewrite() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rewriteLocked()
}

// rewriteLocked writes the live entries to a new file and renames it over the old one, so a
// crash leaves either the old ledger or the new one, never half of one.
func (l *ledger) rewriteLocked() error {
	dir := filepath.Dir(l.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("ran-jobs ledger: %w", err)
	}
	n := 0
	err := atomicfile.Write(l.path, 0o600, func(f io.Writer) error {
		w := bufio.NewWriter(f)
		w.WriteString(ledgerHeader)
		cutoff := l.now().Add(-RanRetention)
		for _, id := range l.order {
			if at, ok := l.ended[id]; ok && at.After(cutoff) {
				fmt.Fprintf(w, "%d %s\n", at.Unix(), id)
				n++
			}
		}
		return w.Flush()
	})
	if err != nil {
		return fmt.Errorf("rewrite ran-jobs ledger %s: %w (check free space and permissions)", l.path, err)
	}
	l.lines = n
	return nil
}
