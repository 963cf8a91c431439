package bundle

import (
	"context"
	"io"
)

// PackWithIndex is Pack returning the frame index its writer recorded, so tests can hold it
// against what ScanFrames finds in the bytes.
func PackWithIndex(ctx context.Context, dir string, w io.Writer) (string, int64, []Frame, error) {
	root, err := resolveRoot(dir)
	if err != nil {
		return "", 0, nil, err
	}
	entries, err := scan(ctx, root, PackOptions{})
	if err != nil {
		return "", 0, nil, err
	}
	return writeBundle(ctx, root, entries, w)
}
