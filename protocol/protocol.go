package protocol

import "time"

// Version is the protocol number exchanged in hello and welcome.
const Version = 1

// Subprotocol is the WebSocket subprotocol every dialer asks for and every acceptor echoes.
const Subprotocol = "rte.v1"

// Paths and headers of PROTOCOL.md section 1.
const (
	SocketPath         = "/rte/v1/socket"     // inbound: the app dials the RTE here
	OutboundSocketPath = "/api/v2/rte/socket" // outbound: the RTE dials the app here
	RegisterPath       = "/api/v2/rte/register"

	HeaderAppNode   = "X-App-Node"
	HeaderRTEName   = "X-RTE-Name"
	HeaderJoinToken = "X-RTE-Join-Token"
)

// Close codes. The 4xxx codes are this protocol's own; 1002 and 1008 are RFC 6455's.
const (
	CloseProtocolError     = 1002 // the dialer did not get the rte.v1 subprotocol back
	ClosePolicyViolation   = 1008 // too many bad messages
	CloseReplaced          = 4001 // a newer authenticated socket took this one's place
	CloseRejected          = 4003 // an admin rejected the runner
	CloseUnsupportedProtoV = 4400 // the peer speaks a protocol version this side does not
)

// Limits. A peer that exceeds one is answered with an error or closed, never trusted.
const (
	MaxMessageBytes = 16 << 20 // one text frame, one JSON message
	MaxChunkPayload = 1 << 20  // payload of one binary bundle frame

	// MaxBundleFrames bounds bundle.frames' frames and bundle.ranges' ranges: far above the
	// frames Pack cuts a 512 MiB directory into, and small enough that either message stays
	// well under MaxMessageBytes.
	MaxBundleFrames = 1 << 16
	// MaxFeatures bounds welcome.features.
	MaxFeatures = 32

	// MaxBadMessages bad messages within BadMessageWindow close the socket with 1008.
	MaxBadMessages   = 100
	BadMessageWindow = time.Minute

	// MinTokenLength is the shortest RTE_TOKEN accepted: shorter ones are guessable.
	MinTokenLength = 16

	// MaxTimeoutS is the largest job.start timeout_s: 7 days. Far beyond any playbook run
	// seen, far below the 292 years at which seconds overflow a time.Duration (a larger value
	// once wrapped negative and ended the job "timeout" at once).
	MaxTimeoutS = 7 * 24 * 60 * 60
)

// Keepalive defaults: each side pings every PingInterval; a socket on which nothing arrived
// for DeadAfter is dead.
const (
	PingInterval = 15 * time.Second
	DeadAfter    = 45 * time.Second
)

// Registration answers (PROTOCOL.md section 2).
const (
	StateApproved = "approved"
	StatePending  = "pending"
)

// Modes and file modes as carried in hello.
const (
	ModeInbound   = "inbound"
	ModeOutbound  = "outbound"
	FilesTransfer = "transfer"
	FilesLocal    = "local"
)
