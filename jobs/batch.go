package jobs

import (
	"bytes"
	"sync"
	"time"

	"github.com/rte-project/rte/protocol"
)

// outputBatch is stdout and stderr on their way to output records: raw bytes -> cut at
// MaxOutputBytes -> masker -> valid UTF-8 -> batch.
type outputBatch struct {
	mask      *masker
	utf       validUTF8
	outBatch  *[]byte // text, not yet encoded; nil when empty
	outSeen   int64
	cut       bool
	discarded int64
}

// eventBatch is the events pipe on its way to events records: lines -> masked -> batch.
type eventBatch struct {
	evBatch   *[]byte // {"events":[... ; nil when empty
	evCount   int
	evLine    []byte // an unfinished line
	evSkip    bool   // discarding the rest of an over-long line
	evNext    []int
	evScratch []byte
	notJSON   int
	tooLong   int
}

// flushTimer makes a batch that is not full wait at most BatchInterval.
type flushTimer struct {
	flush      *time.Timer
	flushArmed bool
}

// output takes a piece of stdout and stderr.
func (r *runner) output(p []byte) {
	if r.spoolErr != nil {
		return
	}
	if r.cut {
		r.discarded += int64(len(p))
		return
	}
	if limit := r.cfg.MaxOutputBytes; limit > 0 && r.outSeen+int64(len(p)) > limit {
		keep := limit - r.outSeen
		r.outputText(p[:keep])
		r.outSeen = limit
		r.discarded += int64(len(p)) - keep
		r.cut = true
		// The held bytes may be the start of a secret whose end is discarded: drop them.
		r.mask.drop()
		r.endText()
		r.appendLog(protocol.LevelWarn, "output cut at %d bytes (PROCESS_MAX_BUFFER); the rest is read and discarded, events and the end still follow", limit)
		return
	}
	r.outSeen += int64(len(p))
	r.outputText(p)
}

func (r *runner) outputText(p []byte) {
	masked := getBuf()
	valid := getBuf()
	*masked = r.mask.write((*masked)[:0], p)
	*valid = r.utf.write((*valid)[:0], *masked)
	r.addOutput(*valid)
	releaseBuf(masked)
	releaseBuf(valid)
}

// endOutput ends the output stream: what the masker and the UTF-8 check held goes out.
func (r *runner) endOutput() {
	if r.spoolErr != nil || r.cut {
		return
	}
	held := getBuf()
	*held = r.mask.flush((*held)[:0])
	valid := getBuf()
	*valid = r.utf.write((*valid)[:0], *held)
	*valid = r.utf.flush(*valid)
	r.addOutput(*valid)
	releaseBuf(held)
	releaseBuf(valid)
	r.flushOutput()
}

// endText flushes the UTF-8 check and the batch, as at the end of the stream.
func (r *runner) endText() {
	valid := getBuf()
	*valid = r.utf.flush((*valid)[:0])
	r.addOutput(*valid)
	releaseBuf(valid)
	r.flushOutput()
}

// addOutput adds valid text to the output batch, appending full batches; a batch ends on a
// rune boundary.
func (r *runner) addOutput(s []byte) {
	for len(s) > 0 {
		if r.outBatch == nil {
			r.outBatch = getBuf()
		}
		room := r.cfg.BatchBytes - len(*r.outBatch)
		if len(s) <= room {
			*r.outBatch = append(*r.outBatch, s...)
			r.armFlush()
			return
		}
		n := runeCut(s, room)
		*r.outBatch = append(*r.outBatch, s[:n]...)
		r.flushOutput()
		s = s[n:]
	}
}

func (r *runner) flushOutput() {
	if r.outBatch == nil {
		return
	}
	text := r.outBatch
	r.outBatch = nil
	if len(*text) > 0 {
		enc := getBuf()
		*enc = append((*enc)[:0], `{"text":`...)
		*enc = appendJSONString(*enc, *text)
		*enc = append(*enc, '}')
		r.append(protocol.KindOutput, bytes.Clone(*enc))
		releaseBuf(enc)
	}
	releaseBuf(text)
}

// events takes a piece of the events pipe: newline-separated JSON events.
func (r *runner) events(p []byte) {
	if r.spoolErr != nil {
		return
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			r.partialEvent(p)
			return
		}
		line := p[:i]
		p = p[i+1:]
		if r.evSkip {
			r.evSkip = false
			continue
		}
		if len(r.evLine) > 0 {
			r.evLine = append(r.evLine, line...)
			line = r.evLine
		}
		if len(line) > maxEventBytes {
			r.tooLong++
		} else {
			r.addEvent(line)
		}
		r.evLine = shrink(r.evLine)
	}
}

func (r *runner) partialEvent(p []byte) {
	if r.evSkip {
		return
	}
	if len(r.evLine)+len(p) > maxEventBytes {
		r.tooLong++
		r.evSkip = true
		r.evLine = nil
		return
	}
	r.evLine = append(r.evLine, p...)
}

// endEvents ends the events stream: a last line without a newline still counts.
func (r *runner) endEvents() {
	if r.spoolErr != nil {
		return
	}
	if len(r.evLine) > 0 && !r.evSkip {
		r.addEvent(r.evLine)
	}
	r.evLine = nil
	r.flushEvents()
}

func (r *runner) addEvent(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var ok bool
	r.evScratch, ok = maskEvent(r.evScratch[:0], line, r.secrets, r.evNext)
	if !ok {
		r.notJSON++
		return
	}
	ev := r.evScratch
	if r.evBatch != nil && len(*r.evBatch)+len(ev)+3 > r.cfg.BatchBytes {
		r.flushEvents()
	}
	if r.evBatch == nil {
		r.evBatch = getBuf()
		*r.evBatch = append((*r.evBatch)[:0], `{"events":[`...)
	} else {
		*r.evBatch = append(*r.evBatch, ',')
	}
	*r.evBatch = append(*r.evBatch, ev...)
	r.evCount++
	r.evScratch = shrink(r.evScratch)
	r.armFlush()
}

// shrink empties b, and lets it go when it is large: one large event must not pin its buffer
// for the rest of the job.
func shrink(b []byte) []byte {
	if cap(b) > 4*readSize {
		return nil
	}
	return b[:0]
}

func (r *runner) flushEvents() {
	if r.evBatch == nil {
		return
	}
	*r.evBatch = append(*r.evBatch, ']', '}')
	r.append(protocol.KindEvents, bytes.Clone(*r.evBatch))
	releaseBuf(r.evBatch)
	r.evBatch = nil
	r.evCount = 0
}

// armFlush makes sure a batch waits at most BatchInterval.
func (r *runner) armFlush() {
	if !r.flushArmed {
		r.flush.Reset(r.cfg.BatchInterval)
		r.flushArmed = true
	}
}

// Scratch and batch buffers, shared by every job so that an idle job holds none.
var bufs = sync.Pool{New: func() any { return new([]byte) }}

func getBuf() *[]byte {
	b := bufs.Get().(*[]byte)
	*b = (*b)[:0]
	return b
}

func releaseBuf(b *[]byte) {
	if cap(*b) <= 4*DefaultBatchBytes {
		bufs.Put(b)
	}
}
