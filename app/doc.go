// Package app is the app half of RTE protocol v1, for the reference app and for any Go app that
// runs playbooks on RTEs: runner registration and approval, pinned dialling of inbound RTEs with
// the handshake, job dispatch, exactly-once storage of every job's records, and connection
// checks through a connected runner (Check; PROTOCOL.md sections 2 to 5 and 7 to 9).
//
// Registration (Handler, POST /api/v2/rte/register) is open to anyone who reaches the app, so
// it only ever records requests: a runner is approved by an admin (Approve) or by the app's join
// token, and at most MaxWaiting requests wait, each for at most WaitingTTL. Connect dials an
// approved runner and trusts exactly the certificate that was approved; the comparison happens
// in the TLS handshake (package pinning), before the runner's token is sent.
//
// Runners with RTE_FILES=transfer get their files as bundles from Config.Files, a
// BundleSource: a job submitted without files has its directories packed when it is
// dispatched, and each bundle.want is answered, for bundles of that runner's job only, by a
// goroutine per bundle whose chunks queue behind the socket's control frames (bundles.go).
//
// An outbound runner dials the app instead (Handler, GET /api/v2/rte/socket): the token and
// the name must belong together, a first join waits for an admin on its open socket (approved
// false in the welcome), and Approve or Reject tell it on that socket; see outbound.go.
//
// Run keeps one socket to each approved inbound runner (run.go). Submit queues a job after
// protocol.JobStart.Validate, so a job the RTE would refuse as invalid is refused here, and
// its errors are typed (ErrInvalidJob, ErrNotFound, ErrNotApproved, ErrNoFiles, ErrRefused,
// *RefusedError) so that an app tells the cases apart without reading text. The runner's
// dispatcher sends a queued job when the runner has a free slot, and a job that waits longer than
// QueueTimeout ends with status error saying why. Records are stored in batches, each batch in
// one Store transaction that keeps every (job, seq) once, and the cumulative ack goes out only
// after that transaction returned, so an acked record is durable and none is stored twice. The
// welcome of every socket carries, per spooled job, the seq the store holds, so the runner
// resends only what is missing. Store is the interface a backend implements: NewMemoryStore
// here, package sqlitestore on a file, package pgstore on PostgreSQL; package storetest is the
// conformance suite every store passes.
//
// Several app nodes may share one store (lease.go, docs/app-nodes.md). Each runner's socket is
// held by one node at a time, named by the runner's lease in the store: inbound, only the
// lease holder dials; outbound, the node the RTE dialled takes the lease. What one node changes
// for a runner whose socket another holds (a job queued or canceled, an approval, a job limit)
// raises the lease's wake counter, which the holder polls every LeasePoll. With
// Config.SecretKey, a job's secrets are stored sealed until the runner has the job, so any node
// can dispatch it (atrest.go).
//
// The config seed (seed.go) declares runners in a YAML file; ApplySeed adds or updates them. A
// runner in ModeDatabase, left over from database mode, moves to outbound when its RTE signs in
// with its token, unless the seed keeps it in database mode.
//
// What it refuses to do:
//   - Accept a changed certificate silently. A registration or a dial that meets a certificate
//     other than the approved one puts the runner back to waiting with that certificate
//     pending, keeping the old one so an admin sees both fingerprints.
//   - Let a caller without the runner's token change an approved runner. A registration with
//     another token is refused and changes nothing, so nobody can knock an approved runner
//     offline or plant a token of their own by registering under its name.
//   - Log a token's or a secret's value, or store a secret's. Only a token's short fingerprint
//     is logged; a job's secrets live in memory (and, with a secret key, sealed in the store)
//     until the runner has the job, sealed per dispatch with the runner's token, and secrets
//     lost to a restart end the job instead of sending it bare.
//   - Let a caller without a waiting request's token change that request, approve a
//     certificate other than the one whose full SHA-256 the admin was given
//     (ApproveCertificate), approve a token, address or certificate other than the ones the
//     admin was shown (ApproveShown compares them under the runner lock; *ChangedError), or tell a caller that proved nothing an approved runner's token
//     fingerprint. Tokens are compared as digests, so their length does not show.
//   - Give one source address more than MaxWaitingPerAddress waiting slots; ClearWaiting
//     frees them all at once.
//   - Ack a record before it is stored, or store a record of a job it did not give that runner.
//     Such records, and anything but capacity from a runner not yet approved, are bad messages:
//     past protocol.MaxBadMessages a minute the socket closes with 1008.
//   - Start a job twice. A job.start that may have been lost is sent again only for a job the
//     runner does not hold, and the RTE answers a repeat with job.accepted without running it.
//   - Let two app nodes undo each other. A node serialises its own changes to runners and jobs
//     with a mutex each; across nodes, the store keeps an ended job ended and a requested
//     cancel requested, whatever a node working from an older read writes (Store.UpdateJob).
package app
