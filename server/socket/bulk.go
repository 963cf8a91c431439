package socket

import (
	"context"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// SendAfterBinary encodes m and queues it as a text frame behind the binary frames already
// queued, for a message that must not overtake them: bundle.end after the last chunk of its
// bundle, or bundle.missing after a transfer that failed half way. Send would put it ahead of
// them, since control frames go first. Like SendBinary, it waits for room in the small bulk
// queue.
func (c *Conn) SendAfterBinary(ctx context.Context, m protocol.Message) error {
	b, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	return c.enqueue(ctx, c.bulk, frame{websocket.TextMessage, b})
}
