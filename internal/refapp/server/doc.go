// Package server runs `rte-app serve` once its settings are checked: it opens the store,
// packs the app's own playbooks for transfer-mode runners (APP_PLAYBOOKS_PATH), applies the
// config seed, and serves the whole HTTP surface on one listener: the protocol's registration
// endpoint, /ready, the admin API and the admin page. Run and Serve block until their context
// ends, then stop dispatch and the HTTP server and wait for both.
//
// It owns the assembly and the lifecycle, with the HTTP server's timeouts and header limit; it
// refuses to parse settings or build the logger (cmd/rte-app does) and adds no policy of its
// own to what package app and package api decide.
package server
