package server

import (
	"fmt"
	"net/http"

	"github.com/rte-project/rte/app"
)

// ready answers GET /ready, for load balancers and orchestrators: 200 while the node reads and
// claims the runners' leases in its store, 503 saying why while it cannot, when it gives up the
// runners it cannot renew (docs/app-nodes.md). It needs no token, so it says no more than that
// the store fails and the store's error, which names the database server but never a password.
func ready(a *app.App) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := a.StoreTrouble(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: the store fails, so this node gives up the runners whose leases it cannot renew: %v\n", err)
			return
		}
		fmt.Fprintln(w, "ready")
	}
}
