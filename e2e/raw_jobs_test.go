package e2e

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/rte-project/rte/protocol"
)

// rawApp is a test's own app end of the socket, for what the real app half never sends:
// duplicate starts, starts beyond capacity.
type rawApp struct {
	t     *testing.T
	ws    *websocket.Conn
	inbox []protocol.Message
}

func (a *rawApp) next() protocol.Message {
	a.t.Helper()
	if len(a.inbox) > 0 {
		m := a.inbox[0]
		a.inbox = a.inbox[1:]
		return m
	}
	return readMsg(a.t, a.ws, time.Minute)
}

// answer waits for the job.accepted or job.refused about job, keeping other messages for later.
func (a *rawApp) answer(job string) protocol.Message {
	a.t.Helper()
	var kept []protocol.Message
	defer func() { a.inbox = append(kept, a.inbox...) }()
	for {
		m := readMsg(a.t, a.ws, time.Minute)
		switch v := m.(type) {
		case *protocol.JobAccepted:
			if v.Job == job {
				return m
			}
		case *protocol.JobRefused:
			if v.Job == job {
				return m
			}
		}
		kept = append(kept, m)
	}
}

// TestCapacityAndDuplicateStart drives the RTE's job handling directly: RTE_MAX_JOBS=1
// refuses a second job "full", the app's settings raise the limit without a restart, a
// duplicate job.start is accepted again and never runs twice, and capacity reports follow.
func TestCapacityAndDuplicateStart(t *testing.T) {
	testdata, _ := filepath.Abs("testdata")
	rte := startRTE(t, t.TempDir(), freePort(t), "RTE_TOKEN="+testToken, "RTE_MAX_JOBS=1",
		"RTE_FILES=local", "ANSIBLE_PATH="+filepath.Join(testdata, "playbooks"),
		"REPO_PATH="+filepath.Join(testdata, "inventory"))
	ws := dialRTE(t, rte, testToken)
	defer ws.Close()
	a := &rawApp{t: t, ws: ws}
	hello, _ := a.next().(*protocol.Hello)
	if hello == nil || hello.MaxJobs != 1 || hello.AnsibleVersion == "" {
		t.Fatalf("hello %+v: want max_jobs 1 and an ansible version", hello)
	}
	send(t, ws, &protocol.Welcome{Protocol: protocol.Version, Node: "raw", Approved: true})

	long := func(id string) *protocol.JobStart {
		return &protocol.JobStart{Job: id, Playbook: "sleep.yml", Inventories: []string{"local.ini"},
			Extravars: json.RawMessage(`{"seconds":"306"}`)}
	}
	send(t, ws, long("cap-1"))
	if _, ok := a.answer("cap-1").(*protocol.JobAccepted); !ok {
		t.Fatal("first job not accepted")
	}
	send(t, ws, long("cap-1"))
	if _, ok := a.answer("cap-1").(*protocol.JobAccepted); !ok {
		t.Fatal("a duplicate job.start was not answered job.accepted")
	}
	send(t, ws, long("cap-2"))
	if ref, ok := a.answer("cap-2").(*protocol.JobRefused); !ok || ref.Code != protocol.RefusedFull {
		t.Fatalf("second job beyond RTE_MAX_JOBS=1: %+v, want refused full", ref)
	}
	send(t, ws, &protocol.Settings{MaxJobs: 2})
	send(t, ws, long("cap-2"))
	if _, ok := a.answer("cap-2").(*protocol.JobAccepted); !ok {
		t.Fatal("job not accepted after settings raised max_jobs to 2")
	}
	send(t, ws, &protocol.JobStart{Job: "bad/id", Playbook: "x.yml"})
	send(t, ws, &protocol.JobStart{Job: "escape", Playbook: "../../etc/passwd.yml", Inventories: []string{"local.ini"}})
	if ref, ok := a.answer("escape").(*protocol.JobRefused); !ok || ref.Code != protocol.RefusedInvalid {
		t.Fatalf("a playbook outside ANSIBLE_PATH: %+v, want refused invalid", ref)
	}
	send(t, ws, &protocol.JobCancel{Job: "cap-1"})
	send(t, ws, &protocol.JobCancel{Job: "cap-2"})

	// Collect until both ends: count the start records of cap-1 (exactly one) and see a
	// capacity report with max_jobs 2.
	starts := map[string]int{}
	ended := map[string]string{}
	sawCapacity2 := false
	deadline := time.Now().Add(2 * time.Minute)
	for len(ended) < 2 && time.Now().Before(deadline) {
		switch m := a.next().(type) {
		case *protocol.Record:
			if m.Kind == protocol.KindStart {
				starts[m.Job]++
			}
			if m.Kind == protocol.KindEnd {
				var d protocol.EndData
				mustJSON(t, m.Data, &d)
				ended[m.Job] = d.Status
			}
			send(t, ws, &protocol.Ack{Job: m.Job, Seq: m.Seq})
		case *protocol.Capacity:
			if m.MaxJobs == 2 {
				sawCapacity2 = true
			}
		case *protocol.Error:
			if m.Ref != "bad/id" {
				t.Fatalf("unexpected error from the RTE: %+v", m)
			}
		}
	}
	if starts["cap-1"] != 1 || starts["cap-2"] != 1 {
		t.Fatalf("start records %v: want exactly one per job", starts)
	}
	if ended["cap-1"] != protocol.StatusCanceled || ended["cap-2"] != protocol.StatusCanceled {
		t.Fatalf("ends %v, want both canceled", ended)
	}
	if !sawCapacity2 {
		t.Fatal("no capacity report with max_jobs 2 after settings")
	}
	waitGone(t, "sleep 306")
}
