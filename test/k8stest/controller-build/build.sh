#!/usr/bin/env bash
# Builds the AWS network policy controller
# (github.com/aws/amazon-network-policy-controller-k8s v1.1.10, the writer of
# the PolicyEndpoints and ClusterPolicyEndpoints enimasq reads) from the Go
# module proxy for the tests in test/k8stest, once, and caches it with the
# module's CRDs.
#
#   test/k8stest/controller-build/build.sh        build what is missing or stale
#   test/k8stest/controller-build/build.sh -dir   print the cache directory
#   test/k8stest/controller-build/build.sh -crds  copy the module's CRDs into
#                                                 the repository (make crds)
#
# Cache: aws-network-policy-controller-v1.1.10/ in the directory of
# kube-apiserver and etcd (../apiserver-build/build.sh -dir, which honours
# $ENIMASQ_K8S_BIN_DIR; test/k8stest computes the same path), holding
# `controller` (the module's cmd package), its stamp (the hash of go.mod,
# go.sum and the link flags: a change of those rebuilds it) and crds/, the
# module's config/crd/bases/*.yaml as they are: the CRDs the controller
# installs itself. Cold, about 5 minutes on 2 cores, module downloads
# included. Concurrent runs wait for each other (flock).
#
# -crds writes the PolicyEndpoint and ClusterPolicyEndpoint CRDs of the
# module into Documentation/deploy/network-policy/crds and the
# PolicyEndpoint one into test/k8stest/crds, named <plural>.<group>.yaml
# and byte for byte the module's (test/k8stest checks they still are).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-go}"
MODULE=github.com/aws/amazon-network-policy-controller-k8s
VERSION=v1.1.10
dir="$("$here/../apiserver-build/build.sh" -dir)/aws-network-policy-controller-${VERSION}"

if [ "${1:-}" = "-dir" ]; then
	echo "$dir"
	exit 0
fi

# The module's directory in the module cache (downloaded, and checked
# against go.sum, when it is not there), at the version go.mod pins, which
# must be VERSION.
moddir() {
	local got
	got="$(cd "$here" && "$GO" list -m -f '{{.Version}}' "$MODULE")"
	if [ "$got" != "$VERSION" ]; then
		echo "$here/go.mod requires $MODULE $got, this script builds $VERSION: change both" >&2
		exit 1
	fi
	(cd "$here" && "$GO" mod download "$MODULE")
	(cd "$here" && "$GO" list -m -f '{{.Dir}}' "$MODULE")
}

if [ "${1:-}" = "-crds" ]; then
	mod="$(moddir)"
	src="$mod/config/crd/bases"
	repo="$here/../../.."
	for target in "Documentation/deploy/network-policy/crds:policyendpoints clusterpolicyendpoints" \
		"test/k8stest/crds:policyendpoints"; do
		to="${target%%:*}"
		for plural in ${target#*:}; do
			install -m 0644 "$src/networking.k8s.aws_${plural}.yaml" "$repo/$to/${plural}.networking.k8s.aws.yaml"
			echo "$to/${plural}.networking.k8s.aws.yaml: $MODULE@$VERSION config/crd/bases/networking.k8s.aws_${plural}.yaml"
		done
	done
	exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

pkg="$MODULE/cmd"
ldflags="-s -w -X $MODULE/pkg/version.GitVersion=$VERSION"
stamp="$( (cat "$here/go.mod" "$here/go.sum"; echo "$pkg $ldflags") | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/controller" ] && [ -d "$dir/crds" ] && [ "$(cat "$dir/controller.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "controller: cached in $dir"
	exit 0
fi
echo "controller: building $pkg@$VERSION into $dir (cold: minutes)"
start=$SECONDS
mod="$(moddir)"
(cd "$here" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldflags" -o "$dir/.controller.tmp" "$pkg")
rm -rf "$dir/.crds.tmp"
mkdir "$dir/.crds.tmp"
cp "$mod"/config/crd/bases/*.yaml "$dir/.crds.tmp/"
chmod 0644 "$dir"/.crds.tmp/*.yaml # the module cache's files are read-only
rm -rf "$dir/crds"
mv "$dir/.crds.tmp" "$dir/crds"
mv -f "$dir/.controller.tmp" "$dir/controller"
echo "$stamp" >"$dir/controller.stamp"
echo "controller: built in $((SECONDS - start))s"
