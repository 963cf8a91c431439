package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/protocol"
)

// FuzzRegister throws arbitrary bodies at the registration endpoint, which anyone who reaches
// the app can call. Whatever comes, the answer is one of the table's, as JSON, and no more than
// MaxWaiting requests ever wait.
func FuzzRegister(f *testing.F) {
	cert := newCert(f)
	valid := baseRequest(cert)
	f.Add(mustJSON(f, valid))
	valid.JoinToken = testJoin
	f.Add(mustJSON(f, valid))
	valid.URL, valid.Certificate, valid.JoinToken = "http://127.0.0.1:8000", "", ""
	f.Add(mustJSON(f, valid))
	f.Add([]byte(`{"name":"a","url":"https://h","token":"0123456789abcdef","certificate":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"}`))
	f.Add([]byte(`{"name":["x"]}`))
	f.Add([]byte(`null`))
	f.Add([]byte{0xff, 0xfe})

	const maxWaiting = 3
	store := app.NewMemoryStore()
	a, err := app.New(app.Config{Store: store, Logger: zap.NewNop(), Node: testNode, JoinToken: testJoin, MaxWaiting: maxWaiting})
	if err != nil {
		f.Fatal(err)
	}
	h := a.Handler()
	allowed := map[int]bool{201: true, 202: true, 400: true, 403: true, 409: true, 413: true, 429: true}

	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, protocol.RegisterPath, bytes.NewReader(body)))
		if !allowed[rec.Code] {
			t.Fatalf("body %q got status %d, which is not in the registration table", body, rec.Code)
		}
		var resp protocol.RegisterResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatalf("answer %d is not JSON: %q", rec.Code, rec.Body.Bytes())
		}
		if rec.Code < 300 && resp.State == "" || rec.Code >= 400 && resp.Error == "" {
			t.Fatalf("answer %d has state %q and error %q: a 2xx needs a state, a 4xx an error", rec.Code, resp.State, resp.Error)
		}
		runners, err := store.ListRunners(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		waiting := 0
		for _, r := range runners {
			if r.State == app.StateWaiting && r.ApprovedAt.IsZero() {
				waiting++
			}
		}
		if waiting > maxWaiting {
			t.Fatalf("%d registration requests wait, the bound is %d", waiting, maxWaiting)
		}
	})
}
