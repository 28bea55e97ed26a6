package bpf

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func TestGroupByMap(t *testing.T) {
	mk := func(name string) *testEntry { return newTestEntry(name, nil, nil) }
	batch := batchOf(mk("a"), mk("b"), mk(""), mk("a"), mk("c"), mk("b"), mk("a"))
	groups := groupByMap(batch, nil)
	want := []mapGroup{{"a", []int{0, 3, 6}}, {"b", []int{1, 5}}, {"c", []int{4}}}
	if len(groups) != len(want) {
		t.Fatalf("groups %v, want %v", groups, want)
	}
	for i := range want {
		if groups[i].name != want[i].name || !slices.Equal(groups[i].idx, want[i].idx) {
			t.Errorf("group %d: %v, want %v", i, groups[i], want[i])
		}
	}
}

func TestApplyBatchResumesAfterEachFailure(t *testing.T) {
	failAt := map[int]bool{0: true, 3: true, 4: true, 9: true}
	var applied, failed []int
	applyBatch(context.Background(), 10,
		func(from int) (int, error) {
			for j := from; j < 10; j++ {
				if failAt[j] {
					return j - from, errors.New("no")
				}
				applied = append(applied, j)
			}
			return 10 - from, nil
		},
		func(j int, err error) { failed = append(failed, j) })
	if !slices.Equal(applied, []int{1, 2, 5, 6, 7, 8}) || !slices.Equal(failed, []int{0, 3, 4, 9}) {
		t.Fatalf("applied %v failed %v", applied, failed)
	}
}
