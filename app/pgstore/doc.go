// Package pgstore is an app.Store on PostgreSQL, through github.com/jackc/pgx/v5 and its pool:
// runners, jobs, the records of every job stored exactly once, and the leases by which app
// nodes on several hosts share the runners' sockets (docs/app-nodes.md).
//
// It keeps the same promises as package sqlitestore, checked by the same conformance suite
// (package storetest):
//   - StoreRecords stores a batch in one transaction; each (job, seq) is a primary key, so a
//     resent record is ignored and the first copy stays. The jobs' rows are locked (FOR UPDATE)
//     while the cumulative head is computed, so two nodes storing records of one job at once
//     cannot both miss each other's rows; the ack goes out only after the commit returned.
//   - ClaimLeases is one transaction of INSERT ... ON CONFLICT DO UPDATE ... WHERE, a
//     compare-and-set that PostgreSQL evaluates against the latest committed row under its
//     lock, so two nodes never both win a lease. Claims lock rows in runner order, so two
//     claimers cannot deadlock.
//   - The schema is created or migrated at Open, one migration after another, under an advisory
//     lock so that nodes starting together do not race, with the version in schema_version.
//
// Times are stored as text in one fixed-width UTC layout with nine fraction digits, as in
// sqlitestore, not as timestamptz: PostgreSQL keeps microseconds, and a record's time must read
// back as the RTE sent it. Text columns that are sorted use the "C" collation, so the order is
// the byte order app.Store promises whatever the database's locale.
//
// The pool is bounded (pool_max_conns in the URL, else DefaultMaxConns), connecting gives up
// after connect_timeout (else DefaultConnectTimeout), and every call gives up after CallTimeout,
// so a server that went away makes calls fail, saying so, instead of hanging: the app then gives
// up the leases it cannot renew, as docs/app-nodes.md says.
//
// What it refuses to do:
//   - Open a database whose schema is newer than this build knows: an older binary writing a
//     newer schema could lose what the newer one relies on.
//   - Store a job's secrets in clear. Job.Start.Secrets is dropped; only the copies sealed with
//     the app's secret key (Job.SealedSecrets) are stored, and only while the job is queued or
//     dispatched. The runners' tokens are stored, because the app presents them when dialling:
//     give the database's role to the app alone, and use TLS (sslmode=verify-full) to a server
//     on another host.
//   - Change an ended job, or take back a requested cancel, whatever an update from an older
//     read says: two app nodes must not undo each other.
//   - Store a record of a job it does not hold, or a second copy of a (job, seq).
package pgstore
