package apptest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/rte-project/rte/app"
	"github.com/rte-project/rte/app/apptest"
	"github.com/rte-project/rte/protocol"
)

// An app author's test: the app dials the fake RTE over pinned TLS, the fake accepts the job,
// sends its output and its end, and sees the app acknowledge both once stored. In a test,
// apptest.Start(t, cfg) replaces New and closes the fake when the test ends.
func Example() {
	const token = "apptest-example-token-0123456789"
	rte, err := apptest.New(apptest.Config{Name: "rte01", Token: token})
	if err != nil {
		panic(err)
	}
	defer rte.Close()

	a, err := app.New(app.Config{Store: app.NewMemoryStore(), Node: "app-1", PollInterval: 20 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The app pins the certificate the fake serves, as it pins a real RTE's after approval.
	if err := a.AddRunner(ctx, &app.Runner{Name: "rte01", URL: rte.URL(), Token: token, Certificate: rte.Certificate()}); err != nil {
		panic(err)
	}
	job, err := a.Submit(ctx, app.JobRequest{Runner: "rte01", JobStart: protocol.JobStart{Playbook: "site.yml"}})
	if err != nil {
		panic(err)
	}
	start := <-rte.Starts()
	fmt.Println("job.start for", start.Playbook)

	rte.Emit(start.Job, protocol.KindOutput, protocol.OutputData{Text: "PLAY [all]\n"})
	rte.Emit(start.Job, protocol.KindEnd, protocol.EndData{Status: protocol.StatusSuccess})
	for rte.Acked(start.Job) < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	stored, err := a.GetJob(ctx, job.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println("stored:", stored.State, stored.Status)
	fmt.Println("violations:", len(rte.Violations()))
	// Output:
	// job.start for site.yml
	// stored: ended success
	// violations: 0
}
