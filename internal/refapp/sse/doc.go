// Package sse is the event-stream encoding of the admin API's job stream
// (GET /api/v2/jobs/{id}/stream): writing one event, and reading events back with a bound on
// each, as the CLI follows a job.
//
// It owns the bytes on the wire only: which events a stream carries, their names (package
// api) and what a follower does with them (package cli) are not its business. The reader
// refuses an event larger than MaxEventBytes rather than growing without limit.
package sse
