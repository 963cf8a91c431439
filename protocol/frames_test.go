package protocol_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rte-project/rte/protocol"
)

const (
	fHash = "sha256:2d09cc910dd77738e3e9a12b5d2baea13723f3ffaf32dde9dc70a050755048ba"
	fHex  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
)

func framesMsg(size int64, frames string) string {
	return fmt.Sprintf(`{"type":"bundle.frames","hash":%q,"size":%d,"frames":[%s]}`, fHash, size, frames)
}

func frame(size int64, sha string) string { return fmt.Sprintf(`{"size":%d,"sha256":%q}`, size, sha) }

func rangesMsg(ranges string) string {
	return fmt.Sprintf(`{"type":"bundle.ranges","job":"j1","hash":%q,"ranges":[%s]}`, fHash, ranges)
}

// TestBundleFramesRefusesHostileFields: every field of the bundle.frames addition is the
// peer's, so counts, sizes, sums, offsets, order and hex are each refused by name.
func TestBundleFramesRefusesHostileFields(t *testing.T) {
	many := strings.Repeat(frame(1, fHex)+",", protocol.MaxBundleFrames) + frame(1, fHex)
	for _, c := range []struct{ name, frame, want string }{
		{"no frames", framesMsg(0, ""), "frames: has 0 frames, want 1 to 65536"},
		{"too many frames", framesMsg(protocol.MaxBundleFrames+1, many), "frames: has 65537 frames"},
		{"frame of 0 bytes", framesMsg(10, frame(0, fHex)+","+frame(10, fHex)), "frames[0].size: 0 is not 1 to the 10 bytes left"},
		{"negative frame", framesMsg(10, frame(-5, fHex)+","+frame(15, fHex)), "frames[0].size: -5"},
		{"frames past the size", framesMsg(10, frame(6, fHex)+","+frame(6, fHex)), "frames[1].size: 6 is not 1 to the 4 bytes left"},
		{"overflowing sum", framesMsg(10, frame(9223372036854775807, fHex)+","+frame(9223372036854775807, fHex)), "frames[0].size: 9223372036854775807"},
		{"frames short of the size", framesMsg(10, frame(4, fHex)+","+frame(4, fHex)), "frames: sizes add up to 8 bytes, not to the bundle's size 10"},
		{"negative size", framesMsg(-1, frame(1, fHex)), "size: must not be negative"},
		{"uppercase hex", framesMsg(1, frame(1, strings.ToUpper(fHex))), "frames[0].sha256"},
		{"short hex", framesMsg(1, frame(1, fHex[:63])), "is not 64 lowercase hex digits"},
		{"prefixed hex", framesMsg(1, frame(1, "sha256:"+fHex)), "frames[0].sha256"},
		{"bad bundle hash", `{"type":"bundle.frames","hash":"sha256:x","size":1,"frames":[` + frame(1, fHex) + `]}`, "hash:"},
		{"range out of order", rangesMsg(`{"offset":100,"size":10},{"offset":50,"size":10}`), "ranges[1].offset: 50 is before the end of the previous range (110)"},
		{"ranges overlapping", rangesMsg(`{"offset":0,"size":10},{"offset":9,"size":10}`), "ranges[1].offset: 9 is before"},
		{"range twice", rangesMsg(`{"offset":0,"size":10},{"offset":0,"size":10}`), "ranges[1].offset"},
		{"negative offset", rangesMsg(`{"offset":-1,"size":10}`), "ranges[0].offset: -1"},
		{"empty range", rangesMsg(`{"offset":5,"size":0}`), "ranges[0].size: 0 must be at least 1"},
		{"range past 2^63", rangesMsg(`{"offset":9223372036854775000,"size":1000}`), "ranges[0].size: 1000 must be at least 1 and end before 2^63"},
		{"too many ranges", rangesMsg(strings.TrimSuffix(strings.Repeat(`{"offset":0,"size":1},`, protocol.MaxBundleFrames+1), ",")), "ranges: has 65537 ranges"},
		{"ranges bad job", `{"type":"bundle.ranges","job":"..","hash":"` + fHash + `","ranges":[]}`, "job:"},
		{"want frames not in hashes", `{"type":"bundle.want","job":"j","hashes":[],"frames":["` + fHash + `"]}`, "frames[0]: " + fHash + " is not one of hashes"},
		{"want frames twice", `{"type":"bundle.want","job":"j","hashes":["` + fHash + `"],"frames":["` + fHash + `","` + fHash + `"]}`, "frames[1]: " + fHash + " is named twice"},
		{"want frames bad hash", `{"type":"bundle.want","job":"j","hashes":["` + fHash + `"],"frames":["sha256:AB"]}`, "frames[0]:"},
		{"welcome feature with space", `{"type":"welcome","protocol":1,"node":"n","approved":true,"features":["bundle frames"]}`, `features[0]: "bundle frames" is not 1 to 64 of [a-z0-9._-]`},
		{"welcome empty feature", `{"type":"welcome","protocol":1,"node":"n","approved":true,"features":[""]}`, "features[0]"},
		{"welcome too many features", `{"type":"welcome","protocol":1,"node":"n","approved":true,"features":[` + strings.TrimSuffix(strings.Repeat(`"a",`, 33), ",") + `]}`, "features: has 33 names, the limit is 32"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := protocol.Decode([]byte(c.frame))
			de, ok := err.(*protocol.DecodeError)
			if !ok || de.Code != protocol.ErrInvalid || !strings.Contains(de.Message, c.want) {
				t.Fatalf("Decode(%.200s) = %v, want an invalid error containing %q", c.frame, err, c.want)
			}
		})
	}
	for _, ok := range []string{
		framesMsg(1, frame(1, fHex)),
		framesMsg(10, frame(3, fHex)+","+frame(7, fHex)),
		rangesMsg(""),
		rangesMsg(`{"offset":0,"size":10},{"offset":10,"size":5},{"offset":100,"size":1}`),
		`{"type":"bundle.want","job":"j","hashes":["` + fHash + `"],"frames":["` + fHash + `"]}`,
		`{"type":"welcome","protocol":1,"node":"n","approved":true,"features":["bundle.frames","from-the-future_2"]}`,
	} {
		if _, err := protocol.Decode([]byte(ok)); err != nil {
			t.Errorf("Decode(%.200s) = %v, want it accepted", ok, err)
		}
	}
	w := protocol.Welcome{Features: []string{"x", protocol.FeatureBundleFrames}}
	if !w.HasFeature(protocol.FeatureBundleFrames) || (protocol.Welcome{}).HasFeature(protocol.FeatureBundleFrames) {
		t.Errorf("HasFeature does not report the feature list")
	}
}
