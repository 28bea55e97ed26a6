package main

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestPodOf(t *testing.T) {
	long := strings.Repeat("A_b.", 70) // 280 characters
	for _, tc := range []struct {
		containerID, cniArgs string
		owner, uid           string
		legacy               []string
	}{
		{"abc123", "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=db-0;K8S_POD_UID=0c8e5d4e-7a3b-4b4e-9d3f-1e2f3a4b5c6d", "shop/db-0", "0c8e5d4e-7a3b-4b4e-9d3f-1e2f3a4b5c6d", nil},
		{"abc123", "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=db-0;K8S_POD_INFRA_CONTAINER_ID=abc123", "shop/db-0", "", nil},
		{"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", "cni/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "", nil},
		{"Web_1.Pod", "", "cni/web-1-pod", "", []string{"cni/Web_1.Pod"}},
		{"_x-", "K8S_POD_NAMESPACE=shop", "cni/x", "", []string{"cni/_x-"}},
		{long, "", "cni/" + strings.TrimRight(strings.Repeat("a-b-", 70)[:253], "-"), "", []string{"cni/" + long}},
	} {
		p, err := podOf(&skel.CmdArgs{ContainerID: tc.containerID, Args: tc.cniArgs})
		if err != nil {
			t.Errorf("%q %q: %v", tc.containerID, tc.cniArgs, err)
			continue
		}
		if p.Owner != tc.owner || p.UID != tc.uid || strings.Join(p.LegacyOwners, ",") != strings.Join(tc.legacy, ",") {
			t.Errorf("%q %q: got %+v, want owner %q uid %q legacy %q", tc.containerID, tc.cniArgs, p, tc.owner, tc.uid, tc.legacy)
		}
		ns, name, _ := strings.Cut(p.Owner, "/")
		if errs := append(validation.IsDNS1123Label(ns), validation.IsDNS1123Subdomain(name)...); len(errs) > 0 {
			t.Errorf("%q: owner %q is not a valid pod name: %v", tc.containerID, p.Owner, errs)
		}
	}
	for _, id := range []string{"", "---", "_."} {
		if p, err := podOf(&skel.CmdArgs{ContainerID: id}); err == nil {
			t.Errorf("container ID %q: got %+v, want an error", id, p)
		}
	}
}
