package deploy_test

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rte-project/rte/protocol"
)

// The compose profile ha: two reference-app nodes, app-a and app-b, in containers of their own
// on one PostgreSQL store (the image rte-postgres:dev), sharing the RTE's socket through the
// store's lease (docs/app-nodes.md).

// takeoverItems is how many items deploy/testdata/takeover.yml loops over.
const takeoverItems = 40

// TestComposeHANodeKilled kills (SIGKILL, docker kill) the container of the node holding the
// RTE's socket while a job runs: the other node takes the socket once the lease expired, the job
// ends, and every record is stored once.
func TestComposeHANodeKilled(t *testing.T) {
	haTakeover(t, "killed", func(p *project, holder string) {
		p.mustCompose(time.Minute, "kill", "-s", "SIGKILL", holder)
	})
}

// TestComposeHANodeCutOff disconnects the node holding the RTE's socket from the store's network
// (docker network disconnect) while a job runs: it can no longer renew its lease, the other node
// takes the socket, the job ends, and every record is stored once, those the cut node received
// but could not store among them (the RTE resends what no node acknowledged).
func TestComposeHANodeCutOff(t *testing.T) {
	haTakeover(t, "cut off from PostgreSQL", func(p *project, holder string) {
		id := strings.TrimSpace(p.mustCompose(time.Minute, "ps", "-q", holder))
		if out, err := exec.Command("docker", "network", "disconnect", p.name+"_store", id).CombinedOutput(); err != nil {
			t.Fatalf("docker network disconnect %s_store %s: %v\n%s", p.name, holder, err, out)
		}
	})
}

// haTakeover brings the profile ha up, finds the node holding rte01's socket, submits a job on
// the other node, and applies fault to the holder once a few items are stored. It then waits for
// the other node to hold the socket (logging how long that took), for the job to end, and checks
// the records: 1 to n once each, every item once, the job a success.
func haTakeover(t *testing.T, what string, fault func(p *project, holder string)) {
	needDocker(t)
	// The PostgreSQL image only: scripts/image without targets (the other compose tests) builds
	// rte:dev, rte-app:dev and rte-host:dev, which this test uses as they are.
	buildImages(t, "postgres")
	p := newProject(t, testFile)
	p.profiles = []string{"ha"}
	start := time.Now()
	p.mustCompose(10*time.Minute, "up", "-d", "--wait")
	t.Logf("up -d --wait (profile ha): %s", time.Since(start).Round(100*time.Millisecond))

	addrs := map[string]string{}
	for _, node := range []string{"app-a", "app-b"} {
		addrs[node] = strings.TrimSpace(p.mustCompose(time.Minute, "port", node, "8080"))
	}
	// holderSeenBy polls node's API until it reports rte01 connected through a node other than
	// not (empty: any node), and returns that node.
	holderSeenBy := func(node, not string, within time.Duration) string {
		t.Helper()
		p.appAddr = addrs[node]
		deadline := time.Now().Add(within)
		for {
			r := p.runner("rte01")
			if r.Connected && r.Node != "" && r.Node != not {
				return r.Node
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s, %s shows runner rte01 as %+v, want it connected through a node other than %q", within, node, r, not)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	holder := holderSeenBy("app-a", "", 2*time.Minute)
	other := map[string]string{"app-a": "app-b", "app-b": "app-a"}[holder]
	if other == "" {
		t.Fatalf("rte01's socket is held by %q, want app-a or app-b", holder)
	}
	if seen := holderSeenBy(other, "", time.Minute); seen != holder {
		t.Fatalf("app-a says %s holds rte01's socket, %s says %s: the nodes disagree on one store", holder, other, seen)
	}

	// Submitted on the node without the socket: it reaches the holder through the store.
	var j job
	p.appAddr = addrs[other]
	p.api("POST", "/api/v2/jobs", map[string]any{
		"runner": "rte01", "playbook": "takeover.yml", "inventories": []string{"hosts.yml"},
	}, &j)
	before := p.storyUntil(j.ID, "(item=3)")

	fault(p, holder)
	faulted := time.Now()
	if got := holderSeenBy(other, holder, 2*time.Minute); got != other {
		t.Fatalf("after %s was %s, %s took rte01's socket, want %s", holder, what, got, other)
	}
	takeover := time.Since(faulted)
	t.Logf("%s %s holding rte01's socket mid-job; %s held it %s later (the lease is 10 s)",
		holder, what, other, takeover.Round(100*time.Millisecond))

	deadline := time.Now().Add(3 * time.Minute)
	for j = p.job(j.ID); j.State != "ended"; j = p.job(j.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the job is %+v 3 minutes after %s took over, want ended", j, other)
		}
		time.Sleep(500 * time.Millisecond)
	}
	after := p.story(j.ID)
	end := checkRecords(t, after.Records)
	if end.Status != protocol.StatusSuccess {
		t.Fatalf("the job ended %+v, want success: the RTE kept running it while the app nodes changed", end)
	}
	for i, r := range before.Records {
		if got := after.Records[i]; got.Seq != r.Seq || got.Kind != r.Kind || string(got.Data) != string(r.Data) {
			t.Fatalf("record %d changed across the takeover: %s %s, then %s %s", r.Seq, r.Kind, r.Data, got.Kind, got.Data)
		}
	}
	seen := map[string]int{}
	for _, m := range regexp.MustCompile(`\(item=(\d+)\)`).FindAllStringSubmatch(after.Output, -1) {
		seen[m[1]]++
	}
	for i := 1; i <= takeoverItems; i++ {
		if n := seen[fmt.Sprint(i)]; n != 1 {
			t.Fatalf("item %d is in the stored output %d times, want once:\n%s", i, n, after.Output)
		}
	}
	if len(seen) != takeoverItems {
		t.Fatalf("%d distinct items in the stored output, want %d", len(seen), takeoverItems)
	}
	t.Logf("%d records, %d items stored once each, %d of the records before the fault; then %s",
		len(after.Records), len(seen), len(before.Records), end.Status)
}
