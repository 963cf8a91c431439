// Package sqlitestore is an app.Store on one SQLite file, through modernc.org/sqlite (pure Go,
// no cgo): runners, jobs and the records of every job, stored exactly once.
//
// Durability is the point of it. The file runs in WAL mode with synchronous=FULL, so a
// transaction is on disk when its commit returns: an ack the app sends after StoreRecords
// promises the RTE it may drop those records, and that promise survives a power cut. Records
// of one batch share one transaction, so a batch costs one fsync, not one per record.
//
// Several processes may open the same file (a busy timeout waits for the other's write): app
// nodes that share it claim the runners' leases in write transactions, each a compare-and-set,
// so one node holds each runner's socket (lease.go). The schema is created or migrated at Open,
// under a write lock, with its version in the schema_version table.
//
// What it refuses to do:
//   - Open a file whose schema is newer than this build knows: an older binary writing a
//     newer schema could lose what the newer one relies on.
//   - Store a job's secrets in clear. Job.Start.Secrets is dropped; only the copies sealed with
//     the app's secret key (Job.SealedSecrets) are stored, and only while the job is queued or
//     dispatched. The runners' tokens are stored, because the app presents them when dialling,
//     so the file is created readable by its owner only (0600).
//   - Change an ended job, or take back a requested cancel, whatever an update from an older
//     read says: two app nodes must not undo each other.
//   - Store a record of a job it does not hold, or a second copy of a (job, seq).
package sqlitestore
