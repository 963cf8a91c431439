// Package protocol is the wire contract between an RTE and the app: message types and their
// validation, the protocol version, close codes, limits, fingerprints, the bundle chunk frame
// and sealed secrets.
//
// Both halves import it, and an app in another repository may too, so it imports nothing of
// this project and no third-party package. It does no I/O: it turns bytes into checked values
// and values into bytes, and leaves sockets, files and retries to its callers.
//
// Version history (bump Version only for a change an older peer cannot ignore; new optional
// keys are not a bump, since unknown keys are ignored):
//
//	1 (2026-12-02): first version: hello/welcome, jobs, bundles, records, capacity,
//	  settings, connection checks, errors.
//	  Same day, still 1 (an older peer never sees the change unless it sends what is now
//	  refused): job ids "." and ".." refused; job.start limit without "@" and timeout_s at
//	  most MaxTimeoutS; job.refused code already_ran.
//	  Later, still 1: job.start env names must be 1 to 128 of [A-Za-z_][A-Za-z0-9_]*
//	  (ValidEnvName) and tags and skip_tags non-blank without commas (ValidTag). The RTE
//	  refused both already when it took the job (job.refused invalid); the decoder now refuses
//	  them (error invalid), and an app using Validate refuses them before sending.
//	  Later, still 1 (new optional keys): job.start image (ValidImage), the job image to run
//	  in; hello images (ValidImagePattern), the images the RTE allows. An older RTE ignores
//	  image and runs the job in its default, so an app sends it only to an RTE whose hello
//	  lists it. The start record's data has image, the image a job's container ran.
package protocol
