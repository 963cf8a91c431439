package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rte-project/rte/internal/refapp/api"
	"github.com/rte-project/rte/jobs/spool"
	"github.com/rte-project/rte/protocol"
)

// DiskRate is the disk's own sequential write rate with an fsync after every block, measured
// in the work directory: the limit any durable store on it meets.
type DiskRate struct {
	Block int
	Bytes int64
	Wall  time.Duration
}

// MBps is the rate in MB/s (10^6 bytes).
func (d DiskRate) MBps() float64 { return float64(d.Bytes) / 1e6 / d.Wall.Seconds() }

// MeasureDisk writes total bytes in blocks of block bytes to a new file in dir, fsyncing after
// each, and removes the file.
func MeasureDisk(dir string, block int, total int64) (DiskRate, error) {
	f, err := os.CreateTemp(dir, "disk-rate-")
	if err != nil {
		return DiskRate{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, block)
	for i := range buf {
		buf[i] = byte('a' + i%26) // not zeros, which a thin-provisioned disk may shortcut
	}
	start := time.Now()
	var n int64
	for n < total {
		if _, err := f.Write(buf); err != nil {
			return DiskRate{}, err
		}
		if err := f.Sync(); err != nil {
			return DiskRate{}, err
		}
		n += int64(block)
	}
	return DiskRate{Block: block, Bytes: n, Wall: time.Since(start)}, nil
}

// SpoolRate is the RTE's spool alone: 64 KiB output records appended the way the job runner
// does (AppendAsync, at most 32 waiting for their fsync), with fsync on, in the work directory.
type SpoolRate struct {
	Records int
	Bytes   int64
	Wall    time.Duration
	Fsyncs  int64
}

// MeasureSpool appends total bytes of 64 KiB output records to a spool in dir.
func MeasureSpool(dir string, total int64) (SpoolRate, error) {
	s, err := spool.Open(dir, spool.Options{})
	if err != nil {
		return SpoolRate{}, err
	}
	defer s.Close()
	text := strings.Repeat(strings.Repeat("7", 99)+"\n", 655) // 65,500 bytes, as a batch is cut
	data, err := json.Marshal(protocol.OutputData{Text: text})
	if err != nil {
		return SpoolRate{}, err
	}
	const window = 32 // the job runner's limit on records waiting for durability
	var waiting []*spool.Commit
	r := SpoolRate{}
	start := time.Now()
	for r.Bytes < total {
		c, err := s.AppendAsync("spool-rate", protocol.KindOutput, data)
		if err != nil {
			return r, err
		}
		waiting = append(waiting, c)
		r.Records++
		r.Bytes += int64(len(text))
		if len(waiting) == window {
			if _, err := waiting[0].Wait(); err != nil {
				return r, err
			}
			waiting = waiting[1:]
		}
	}
	for _, c := range waiting {
		if _, err := c.Wait(); err != nil {
			return r, err
		}
	}
	r.Wall = time.Since(start)
	r.Fsyncs = s.Stats().Syncs
	return r, nil
}

// FlowResult is one stand-in job through one RTE to the app's committed store.
type FlowResult struct {
	Round    int
	Produced int64         // bytes printed, or events written, by the stand-in
	Stored   Stored        // what the app's store holds afterwards, read back
	Wall     time.Duration // from submitting the job to the app holding its end
	RTECPU   time.Duration // the RTE's own CPU
	JobCPU   time.Duration // the stand-in's, reaped by the RTE
	AppCPU   time.Duration
	RTEWrite int64 // bytes the RTE process tree wrote to storage (spool)
	AppWrite int64 // bytes the app wrote to storage (SQLite and its WAL)
}

// runFlow submits one stand-in job with env, waits for its end in the store, and counts.
func runFlow(ctx context.Context, r *Rig, env map[string]string) (FlowResult, error) {
	var res FlowResult
	rteBefore, err := ReadCounters(r.RTE.Pid())
	if err != nil {
		return res, err
	}
	appBefore, err := ReadCounters(r.App.Pid())
	if err != nil {
		return res, err
	}
	start := time.Now()
	id, err := r.Submit(ctx, api.JobOptions{Playbook: "standin.yml", Inventories: []string{"local.ini"}, Env: env})
	if err != nil {
		return res, err
	}
	j, err := r.WaitEnded(ctx, id, 30*time.Minute)
	res.Wall = time.Since(start)
	if err != nil {
		return res, err
	}
	rteAfter, err := ReadCounters(r.RTE.Pid())
	if err != nil {
		return res, err
	}
	appAfter, err := ReadCounters(r.App.Pid())
	if err != nil {
		return res, err
	}
	d, a := rteAfter.Sub(rteBefore), appAfter.Sub(appBefore)
	res.RTECPU, res.JobCPU, res.RTEWrite, res.AppCPU, res.AppWrite = d.CPU-d.ChildCPU, d.ChildCPU, d.WriteDisk, a.CPU, a.WriteDisk
	if j.Status != protocol.StatusSuccess {
		return res, fmt.Errorf("job %s ended %s: %s", id, j.Status, j.Message)
	}
	res.Stored, err = r.Count(ctx, id)
	return res, err
}

// standInRig starts a rig whose RTE runs the stand-in.
func standInRig(ctx context.Context, bin Binaries, dir string, env ...string) (*Rig, error) {
	path, err := standIn(dir)
	if err != nil {
		return nil, err
	}
	pb, inv, err := standInPlaybook(dir)
	if err != nil {
		return nil, err
	}
	return StartRig(ctx, RigConfig{Bin: bin, Dir: filepath.Join(dir, "rig"), Path: path + ":" + os.Getenv("PATH"),
		AnsiblePath: pb, RepoPath: inv, Env: env})
}

// RecordResult is the record path section: the end-to-end flows and the limits beside them.
type RecordResult struct {
	Flows []FlowResult
	Disk  []DiskRate
	Spool SpoolRate
}

// RecordPath measures a stand-in printing bytes per job as fast as it can, rounds times,
// with the disk's and the spool's own rates measured in the same directory between rounds.
func RecordPath(ctx context.Context, bin Binaries, work string, bytes int64, diskBytes int64, rounds int, progress io.Writer) (RecordResult, error) {
	var res RecordResult
	dir := filepath.Join(work, "record")
	r, err := standInRig(ctx, bin, dir)
	if err != nil {
		return res, err
	}
	defer r.Stop()
	for round := 1; round <= rounds; round++ {
		f, err := runFlow(ctx, r, map[string]string{"BENCH_BYTES": strconv.FormatInt(bytes, 10)})
		f.Round, f.Produced = round, bytes
		if err != nil {
			return res, err
		}
		if f.Stored.OutputBytes != bytes {
			return res, fmt.Errorf("round %d: the stand-in printed %d bytes and the store holds %d", round, bytes, f.Stored.OutputBytes)
		}
		res.Flows = append(res.Flows, f)
		fmt.Fprintf(progress, "  round %d record path %.1f MB/s (%s in %.1fs; RTE cpu %.1fs, app cpu %.1fs)\n", round,
			float64(bytes)/1e6/f.Wall.Seconds(), mb(bytes), f.Wall.Seconds(), f.RTECPU.Seconds(), f.AppCPU.Seconds())
		// The limits, in the same directory, between the rounds so both meet the same load.
		for _, block := range []int{64 << 10, 1 << 20} {
			total := diskBytes
			if block == 64<<10 {
				total = diskBytes / 4
			}
			d, err := MeasureDisk(dir, block, total)
			if err != nil {
				return res, err
			}
			res.Disk = append(res.Disk, d)
			fmt.Fprintf(progress, "  round %d disk, %d KiB blocks + fsync: %.1f MB/s\n", round, block>>10, d.MBps())
		}
	}
	sp, err := MeasureSpool(filepath.Join(dir, "spool-rate"), diskBytes)
	if err != nil {
		return res, err
	}
	res.Spool = sp
	fmt.Fprintf(progress, "  spool alone: %.1f MB/s, %.1f records per fsync\n", float64(sp.Bytes)/1e6/sp.Wall.Seconds(), float64(sp.Records)/float64(max(sp.Fsyncs, 1)))
	return res, nil
}

// Events measures a stand-in writing n events as fast as it can, rounds times.
func Events(ctx context.Context, bin Binaries, work string, n int, rounds int, progress io.Writer) ([]FlowResult, error) {
	dir := filepath.Join(work, "events")
	r, err := standInRig(ctx, bin, dir)
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	file := filepath.Join(dir, "events.jsonl")
	if err := writeEvents(file, n); err != nil {
		return nil, err
	}
	var out []FlowResult
	for round := 1; round <= rounds; round++ {
		f, err := runFlow(ctx, r, map[string]string{"BENCH_EVENTS": file})
		f.Round, f.Produced = round, int64(n)
		if err != nil {
			return out, err
		}
		if f.Stored.Events != int64(n) {
			return out, fmt.Errorf("round %d: the stand-in wrote %d events and the store holds %d", round, n, f.Stored.Events)
		}
		out = append(out, f)
		fmt.Fprintf(progress, "  round %d events %.0f/s (%d in %.1fs; RTE cpu %.1fs, app cpu %.1fs)\n", round,
			float64(n)/f.Wall.Seconds(), n, f.Wall.Seconds(), f.RTECPU.Seconds(), f.AppCPU.Seconds())
	}
	return out, nil
}
