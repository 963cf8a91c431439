// Package socket owns one WebSocket connection of protocol v1, on either side: the single
// writer that gorilla/websocket requires, keepalive (ping every PingInterval, dead after
// DeadAfter of silence), read limits, the priority of control messages over bundle chunks, and
// the bad-message budget (protocol.MaxBadMessages a minute, then close 1008).
//
// It does not know what messages mean: the RTE's session and the app half read frames from it
// and decide. It never redials; whoever dialled or accepted the socket owns that.
package socket
