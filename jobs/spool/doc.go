// Package spool is the RTE's per-job append-only record log (PROTOCOL.md section 7).
//
// Every record of a job is appended here and made durable (fsync) before the session may send
// it, and it stays until the app acknowledges it, so a dropped socket, a restarted RTE or a
// power loss loses no record that Append reported as stored. Seq numbers are assigned here:
// 1, 2, ... per job, without gaps.
//
// The spool owns the files in its directory and one goroutine, the syncer, which groups fsyncs:
// every Append that arrives while a sync is in flight is covered by the next single sync, so a
// chatty playbook costs one fsync per batch, not one per line.
//
// It refuses: job ids outside protocol.ValidJobID (they become file names), records that are
// not valid protocol records, appends after a job's end record, and a directory that another
// process already has open as its spool. It knows nothing about sockets, sessions or how a job
// runs; it does not append the "abandoned" end of a job that was running when the RTE stopped
// (the caller does, after Open, for each job listed with Ended false).
//
// # File format
//
// One file per job, <dir>/<job>.spool, mode 0600, opened with O_APPEND:
//
//	header  "RTE spool 1\n" (12 bytes; the 1 is the format version)
//	frame*  length  uint32, big endian: payload bytes, 1 to protocol.MaxMessageBytes
//	        crc     uint32, big endian: CRC-32C (Castagnoli) of the 4 length bytes and the payload
//	        payload the record exactly as sent: protocol.Encode of a protocol.Record,
//	                {"type":"record","job":...,"seq":...,"kind":...,"at":...,"data":{...}}
//
// Frames hold seq 1, 2, ... in order, and nothing follows an end record. Open scans every file
// and cuts it at the first frame that is torn (cut short), fails its checksum, or breaks those
// rules: that frame was being written when the RTE or the machine stopped, so it was never
// reported durable, and nothing after it was either.
//
// The acknowledged position is kept in memory only. After a restart every record of a job is
// pending again until the app's welcome (its acked map) or a new ack says otherwise; resending
// a record the app already has is harmless, since the app stores each (job, seq) once. Not
// persisting it saves a write and a sync per ack.
package spool
