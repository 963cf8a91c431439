// Package app is the app half of RTE protocol v1, for the reference app and for any Go app that
// runs playbooks on RTEs: runner registration and approval, and pinned dialling of inbound RTEs
// with the handshake (PROTOCOL.md sections 2 to 4).
//
// Registration (Handler, POST /api/v2/rte/register) is open to anyone who reaches the app, so
// it only ever records requests: a runner is approved by an admin (Approve) or by the app's join
// token, and at most MaxWaiting requests wait, each for at most WaitingTTL. Connect dials an
// approved runner and trusts exactly the certificate that was approved; the comparison happens
// in the TLS handshake (package pinning), before the runner's token is sent.
//
// What it refuses to do:
//   - Accept a changed certificate silently. A registration or a dial that meets a certificate
//     other than the approved one puts the runner back to waiting with that certificate
//     pending, keeping the old one so an admin sees both fingerprints.
//   - Let a caller without the runner's token change an approved runner. A registration with
//     another token is refused and changes nothing, so nobody can knock an approved runner
//     offline or plant a token of their own by registering under its name.
//   - Log a token. Only its short fingerprint is logged or answered.
//   - Decide what a job is. Dispatch, bundles and record storage sit above Peer, which hands
//     out checked messages and answers bad ones.
//
// The App serialises its own changes to a runner with one mutex; several app nodes sharing one
// store need the store to serialise them instead.
package app
