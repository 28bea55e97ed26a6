package allocator

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/enimasq/enimasq/cells/errtext"
	"github.com/enimasq/enimasq/ipam/allocations"
)

// validateOwner checks an owner as the API server would check the pod it
// names: "NAMESPACE/NAME", the namespace a DNS-1123 label, the name a
// DNS-1123 subdomain.
func validateOwner(owner string) error {
	ns, name, ok := strings.Cut(owner, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("owner %q: want NAMESPACE/POD", errtext.Short(owner))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("owner %q: namespace %q: %s", errtext.Short(owner), errtext.Short(ns), strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("owner %q: pod name %q: %s", errtext.Short(owner), errtext.Short(name), strings.Join(errs, "; "))
	}
	return nil
}

// validateLegacyOwner is the owner check of checkpoints of version 1,
// which predate validateOwner: NAMESPACE/POD, printable, no space.
func validateLegacyOwner(owner string) error {
	ns, pod, ok := strings.Cut(owner, "/")
	if !ok || ns == "" || pod == "" || strings.Contains(pod, "/") || len(owner) > 512 {
		return fmt.Errorf("owner %q: want NAMESPACE/POD", errtext.Short(owner))
	}
	for _, r := range owner {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("owner %q: contains a space or a control character", errtext.Short(owner))
		}
	}
	return nil
}

// containerIDPattern is the CNI spec's container ID: alphanumeric, then
// also underscore, dot and hyphen.
var containerIDPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// validateAttachment checks an attachment as the CNI spec defines its
// parts. The zero attachment (an API allocation) is valid.
func validateAttachment(a allocations.Attachment) error {
	if a.IsZero() {
		return nil
	}
	switch {
	case a.ContainerID == "":
		return fmt.Errorf("ifname %q without a containerID", errtext.Short(a.IfName))
	case len(a.ContainerID) > 256 || !containerIDPattern.MatchString(a.ContainerID):
		return fmt.Errorf("containerID %q: want letters, digits, '_', '.' and '-', starting with a letter or digit, at most 256", errtext.Short(a.ContainerID))
	}
	if err := validateNetwork(a.Network); err != nil {
		return err
	}
	return validateIfName(a.IfName)
}

// validateNetwork is the CNI spec's network name (the same characters as a
// container ID), or none.
func validateNetwork(name string) error {
	if name != "" && (len(name) > 256 || !containerIDPattern.MatchString(name)) {
		return fmt.Errorf("network %q: want letters, digits, '_', '.' and '-', starting with a letter or digit, at most 256", errtext.Short(name))
	}
	return nil
}

// validateIfName is the CNI spec's (and the kernel's) interface name.
func validateIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("ifname is empty")
	case len(name) > 15:
		return fmt.Errorf("ifname %q: longer than 15 bytes", errtext.Short(name))
	case name == "." || name == "..":
		return fmt.Errorf("ifname %q is not an interface name", name)
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("ifname %q: contains '/', ':', a space or a control character", errtext.Short(name))
		}
	}
	return nil
}

// validatePodUID checks a pod UID: a UUID as the API server makes them
// (letters, digits and hyphens, at most 36).
func validatePodUID(uid string) error {
	if len(uid) > 36 || strings.TrimLeft(strings.ToLower(uid), "0123456789abcdef-") != "" {
		return fmt.Errorf("podUID %q: want a UUID", errtext.Short(uid))
	}
	return nil
}
