// Package cache is the RTE's store of content-addressed bundles (RTE_FILES=transfer): it
// receives bundles into RTE_CACHE_PATH, checking each one's size and sha256 before it gets its
// name, keeps the total under RTE_CACHE_MB by evicting the least recently used, and prepares a
// job by unpacking its bundles into a private directory (package bundle does the unpacking).
//
// One cache directory may be shared by several RTEs (pods mounting one volume, run as one
// user). Everything they share is made safe with the file system alone:
//
//	<Dir>/bundles/<hex>.tar.zst        complete, verified bundles; a name appears only by link(2)
//	<Dir>/frames/<hex>.frames          each bundle's zstd frame index, written after its commit
//	<Dir>/locks/<hex>.lock             flock(2) pins: shared while a job needs the bundle,
//	                                   exclusive (non-blocking) for the instant of eviction
//	<Dir>/rtes/<owner>/alive           the owner's heartbeat (mtime)
//	<Dir>/rtes/<owner>/incoming/       bundles being received, under unique names
//	<Dir>/rtes/<owner>/jobs/<job>/     job directories made by JobDir (0700)
//
// Incoming.Fill serves the protocol feature bundle.frames: it copies into a bundle being
// received the frames that cached bundles already hold, found by SHA-256 in the frame indexes
// and hashed again when copied, so that only the rest is fetched. An index is a hint, never
// trusted: Commit verifies the whole bundle as for any other.
//
// A bundle appears under its name complete or not at all, and a second commit of the same
// bundle is a no-op. Eviction never removes a pinned bundle, whichever RTE pinned it. An RTE
// that stops heartbeating for StaleAfter (killed mid-job, or replaced under a new name) has its
// whole rtes/<owner> directory removed by whichever RTE sweeps next.
//
// It refuses: a bundle whose bytes do not hash to its name or whose size differs from what
// was announced (the temporary file is removed), a bundle larger than the whole cache,
// playbook or inventory paths that leave their bundle, and everything package bundle refuses
// when unpacking (a *BadBundleError, after which the caller Discards the bundle). It knows nothing of sockets: the session feeds Receive, and the jobs
// package calls Prepare.
package cache
