// Package bundle packs a directory into a bundle and unpacks a bundle into a directory
// (PROTOCOL.md section 6). A bundle is a POSIX tar stream compressed with zstd, named
// "sha256:<hex>" over its compressed bytes.
//
// Pack is the app's half. It is deterministic, so an unchanged directory keeps its name and
// the RTE fetches it once: entries in walk order (each directory before its contents, names
// sorted bytewise), owner 0:0 with no user or group names, every mtime set to FixedModTime,
// permission bits kept and setuid, setgid and sticky dropped, and zstd at one fixed level on
// one goroutine, cut into independent zstd frames at entry boundaries chosen by entry names
// (see Frame): still one valid tar.zst, but a small change to the tree changes one frame, so an
// RTE holding an older bundle fetches only that (ScanFrames reads a bundle's frames back; the
// protocol feature is bundle.frames). Packer adds an on-disk cache so that an unchanged directory is neither read
// nor compressed again for every job.
//
// Pack never packs what the RTE must not receive or cannot use: .ssh directories, files named
// like SSH private identities (id_rsa, id_ed25519, ...), and version-control metadata (.git,
// .hg, .svn); see Excluded. It refuses symlinks whose target is absolute or leaves the
// directory, and sockets, devices and fifos, naming the path, rather than send a tree that
// would not work on the RTE.
//
// Unpack is the RTE's half and treats every bundle as hostile: it refuses absolute paths, ".."
// elements, writing through a symlink, symlinks that could resolve outside the destination,
// hard links, devices, fifos and sockets, duplicate entries, and anything past UnpackLimits.
// It clears setuid, setgid and sticky bits. On any error it removes everything it wrote.
//
// FilePath and Stored are the one statement of how a directory keeps bundles (<hex>.tar.zst,
// the mtime as the last use) and of their least-recently-used order: the app's Packer and the
// RTE's cache package both evict by them. The package decides nothing about eviction (how
// much to keep, pins, locks) and knows nothing of sockets or jobs; the RTE's cache package
// stores bundles and calls Unpack.
package bundle
