package compile

import (
	"testing"

	"github.com/enimasq/enimasq/bpf/policybpf"
)

// TestSwitchTiers: which of a pod's tiers come into force, given how far
// their new versions and the edits of their versions in force are written.
func TestSwitchTiers(t *testing.T) {
	const closed = policybpf.PolicyVersionClosed
	both := [len(tiers)]bool{true, true}
	// How far a tier is written: its version on the way whole / being
	// written / refused, its version in force whole (edit) or not.
	ok := written{whole: true, edit: true}
	writing := written{edit: true}
	failed := written{failure: "refused", edit: true}
	editing := written{whole: true}
	editFailed := written{whole: true, editFailure: "refused"}
	for _, tc := range []struct {
		name        string
		tvs         [len(tiers)]TierVersions
		initialized [len(tiers)]bool
		w           [len(tiers)]written
		want        [len(tiers)]TierVersions
		switched    bool
		failures    int
	}{
		{"one tier whole", [2]TierVersions{{Active: 1, Want: 2}, {}}, both, [2]written{ok, ok},
			[2]TierVersions{{Prev: 1, Active: 2, Want: 2}, {}}, true, 0},
		{"both whole: together", [2]TierVersions{{Active: 1, Want: 2}, {Active: 3, Want: 4}}, both, [2]written{ok, ok},
			[2]TierVersions{{Prev: 1, Active: 2, Want: 2}, {Prev: 3, Active: 4, Want: 4}}, true, 0},
		{"one whole waits for the other being written", [2]TierVersions{{Active: 1, Want: 2}, {Active: 3, Want: 4}}, both, [2]written{ok, writing},
			[2]TierVersions{{Active: 1, Want: 2}, {Active: 3, Want: 4}}, false, 0},
		{"one whole does not wait for one that failed", [2]TierVersions{{Active: 1, Want: 2}, {Active: 3, Want: 4}}, both, [2]written{ok, failed},
			[2]TierVersions{{Prev: 1, Active: 2, Want: 2}, {Active: 3, Want: 4, Failed: "refused"}}, true, 1},
		{"a first version that failed: closed", [2]TierVersions{{Want: 2}, {}}, both, [2]written{failed, ok},
			[2]TierVersions{{Active: closed, Want: 2, Failed: "refused"}, {}}, true, 1},
		{"an uninitialized tier neither switches nor holds up", [2]TierVersions{{Active: 1, Want: 2}, {Active: 3, Want: 4}}, [2]bool{true, false}, [2]written{ok, writing},
			[2]TierVersions{{Prev: 1, Active: 2, Want: 2}, {Active: 3, Want: 4}}, true, 0},
		{"an edit in place done", [2]TierVersions{{Active: 1, Want: 1, Rows: 3, Editing: true}, {}}, both, [2]written{ok, ok},
			[2]TierVersions{{Active: 1, Want: 1, Rows: 3}, {}}, false, 0},
		{"an edit in place failing", [2]TierVersions{{Active: 1, Want: 1, Rows: 3, Editing: true}, {}}, both, [2]written{editFailed, ok},
			[2]TierVersions{{Active: 1, Want: 1, Rows: 3, Editing: true, Failed: "refused"}, {}}, false, 1},
		{"a row of the version in force lost: editing", [2]TierVersions{{Active: 1, Want: 1, Rows: 3}, {}}, both, [2]written{editing, ok},
			[2]TierVersions{{Active: 1, Want: 1, Rows: 3, Editing: true}, {}}, false, 0},
		{"an edit being written holds up the other tier", [2]TierVersions{{Active: 1, Want: 1, Editing: true}, {Active: 3, Want: 4}}, both, [2]written{editing, ok},
			[2]TierVersions{{Active: 1, Want: 1, Editing: true}, {Active: 3, Want: 4}}, false, 0},
		{"a failing edit does not", [2]TierVersions{{Active: 1, Want: 1, Editing: true}, {Active: 3, Want: 4}}, both, [2]written{editFailed, ok},
			[2]TierVersions{{Active: 1, Want: 1, Editing: true, Failed: "refused"}, {Prev: 3, Active: 4, Want: 4}}, true, 1},
		{"a version being written again keeps what failed said", [2]TierVersions{{Active: 1, Want: 2, Failed: "refused"}, {}}, both, [2]written{writing, ok},
			[2]TierVersions{{Active: 1, Want: 2, Failed: "refused"}, {}}, false, 0},
		{"an edit of the version a new one replaces does not hold it up", [2]TierVersions{{Active: 1, Want: 2, Editing: true}, {}}, both, [2]written{{whole: true}, ok},
			[2]TierVersions{{Prev: 1, Active: 2, Want: 2}, {}}, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tvs := tc.tvs
			switched, failures := switchTiers(&tvs, tc.initialized, tc.w)
			if tvs != tc.want || switched != tc.switched || len(failures) != tc.failures {
				t.Errorf("got %+v, switched %t, failures %q\nwant %+v, switched %t, %d failures", tvs, switched, failures, tc.want, tc.switched, tc.failures)
			}
		})
	}
}
