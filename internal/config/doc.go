// Package config owns the RTE's settings: it reads the environment variables of
// docs/settings.md once, applies their defaults, checks every value, and returns either
// Settings that the rest of the RTE can trust or a *Problems listing everything that is wrong,
// one line per problem, each naming the variable and what to do about it. A start with a bad
// setting is refused as a whole: the operator fixes everything in one round instead of meeting
// the problems one restart at a time.
//
// Database mode (AnsibleForms 7.0-7.2, where the RTE read jobs from the app's database) is gone.
// Its variables are refused rather than ignored, because an RTE that silently ignored DB_* would
// look configured while no job ever reached it; the refusal points at
// docs/migration-from-database-mode.md.
//
// The package refuses to do anything but parse and check: it does not read the process
// environment (the caller passes it in), touch files or the network, or log. Problems that only
// I/O can find (a missing certificate file, an unreachable APP_URL) belong to the packages that
// do that I/O. Advice that does not stop the start comes back from Warnings for the caller to
// log. Token values are held as Secret, which prints as "[redacted]", so that logging Settings
// by accident does not leak them; Effective gives a loggable view of every setting.
package config
