package protocol_test

import (
	"testing"

	"github.com/rte-project/rte/protocol"
)

func TestRefNamesWhatAMessageIsAbout(t *testing.T) {
	for _, c := range []struct {
		m    protocol.Message
		want string
	}{
		{&protocol.Record{Job: "j1"}, "j1"},
		{&protocol.JobStart{Job: "j2"}, "j2"},
		{&protocol.JobCancel{Job: "j3"}, "j3"},
		{&protocol.JobAccepted{Job: "j4"}, "j4"},
		{&protocol.JobRefused{Job: "j5"}, "j5"},
		{&protocol.BundleWant{Job: "j6"}, "j6"},
		{&protocol.BundleEnd{Hash: "h1"}, "h1"},
		{&protocol.BundleMissing{Hash: "h2"}, "h2"},
		{&protocol.Check{ID: "c1"}, "c1"},
		{&protocol.CheckResult{ID: "c2"}, "c2"},
		{&protocol.Capacity{}, ""},
	} {
		if got := protocol.Ref(c.m); got != c.want {
			t.Errorf("Ref(%s) = %q, want %q", c.m.Type(), got, c.want)
		}
	}
}
