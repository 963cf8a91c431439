// Package settings owns `rte-app serve`'s settings: it reads the APP_* and RTE_* variables of
// docs/reference-app.md from an environment passed in, applies their defaults, checks every
// value and the config seed (APP_SEED), and returns either Settings the app can trust or a
// *config.Problems listing everything wrong, one "VAR: message" per line, so the operator fixes
// them in one round. Tokens are config.Secret, which prints as "[redacted]".
//
// It shares the RTE's machinery (internal/config's Secret, Problems and Quote) rather than a
// copy, so both programs refuse a bad start in the same shape. It refuses to read the process
// environment itself, to open the store or listen, or to log: package server does the I/O, and
// cmd/rte-app decides what a refusal does to the process.
package settings
