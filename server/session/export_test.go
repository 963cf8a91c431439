package session

// WaitingFor reports how many Fetch calls wait for the bundle, so a test can act once a job
// has joined a transfer.
func WaitingFor(m *Manager, hash string) int {
	m.bundles.mu.Lock()
	defer m.bundles.mu.Unlock()
	n := 0
	if t := m.bundles.byHash[hash]; t != nil {
		for _, c := range t.waiters {
			n += c
		}
	}
	return n
}
