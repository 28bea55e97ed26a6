#!/usr/bin/env bash
# Builds kube-apiserver (k8s.io/kubernetes v1.37.2) and etcd (v3.6.16) from
# the Go module proxy for the tests in test/k8s, once, and caches them.
#
#   test/k8stest/apiserver-build/build.sh        build what is missing or stale
#   test/k8stest/apiserver-build/build.sh -dir   print the cache directory
#
# Cache: $ENIMASQ_K8S_BIN_DIR, else ${XDG_CACHE_HOME:-~/.cache}/enimasq/
# k8s-v1.37.2-etcd-v3.6.16 (test/k8s computes the same path). Each binary has
# a stamp holding the hash of its go.mod, go.sum and link flags: a change of
# those rebuilds it, otherwise it is found cached in well under a second.
# Cold, kube-apiserver takes about 10 minutes on 2 cores, etcd about two.
# Concurrent runs wait for each other (flock).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-go}"
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
dir="${ENIMASQ_K8S_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/enimasq/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}}"

if [ "${1:-}" = "-dir" ]; then
	echo "$dir"
	exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

# build NAME MODULE-DIR PACKAGE LDFLAGS
build() {
	local name="$1" mod="$here/$2" pkg="$3" ldflags="$4"
	local stamp
	stamp="$( (cat "$mod/go.mod" "$mod/go.sum"; echo "$pkg $ldflags") | sha256sum | cut -d' ' -f1)"
	if [ -x "$dir/$name" ] && [ "$(cat "$dir/$name.stamp" 2>/dev/null)" = "$stamp" ]; then
		echo "$name: cached in $dir"
		return
	fi
	echo "$name: building $pkg into $dir (cold: minutes)"
	local start=$SECONDS
	(cd "$mod" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "$ldflags" -o "$dir/.$name.tmp" "$pkg")
	mv -f "$dir/.$name.tmp" "$dir/$name"
	echo "$stamp" >"$dir/$name.stamp"
	echo "$name: built in $((SECONDS - start))s"
}

vpkg=k8s.io/component-base/version
major="${K8S_VERSION#v}"
minor="${major#*.}"
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
	"-s -w -X $vpkg.gitVersion=$K8S_VERSION -X $vpkg.gitMajor=${major%%.*} -X $vpkg.gitMinor=${minor%%.*} -X $vpkg.gitTreeState=clean"
