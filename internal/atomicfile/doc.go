// Package atomicfile replaces a file so that a crash or a power loss leaves under its name
// either the old content or the whole new content, never a torn mix: it writes a temporary
// file beside the target, syncs it, renames it over the target and syncs the directory, whose
// entry is what the rename changed. It also owns syncing a directory on its own, for callers
// that create or rename files their own way (the spool, the certificate pair).
//
// It refuses nothing about the content and decides nothing about it. It does not create
// missing directories, does not lock (of two writers of one name the last rename wins), and
// does not keep the old content: a caller that needs a history keeps it itself.
package atomicfile
