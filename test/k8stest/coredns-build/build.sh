#!/usr/bin/env bash
# Builds CoreDNS (github.com/coredns/coredns v1.15.0, every in-tree plugin)
# from the Go module proxy for the tests that need a real resolver
# (test/coredns_helpers_test.go), once, and caches it.
#
#   test/k8stest/coredns-build/build.sh        build what is missing or stale
#   test/k8stest/coredns-build/build.sh -dir   print the cache directory
#
# Cache: ${XDG_CACHE_HOME:-~/.cache}/enimasq/coredns-v1.15.0 (the tests
# compute the same path), holding `coredns` and its stamp (the hash of the
# module version and the link flags: a change of those rebuilds it,
# otherwise it is found cached in well under a second).
#
# No module of ours: CoreDNS's go.mod has no replace directive, so
# `go install MODULE@VERSION` builds it in its own module with the
# dependency versions its release pins (and its go.sum checks), outside
# the main module's graph. Cold, about 9 minutes on 2 cores, module
# downloads (about 150 modules) included. Concurrent runs wait for each
# other (flock).
set -euo pipefail

GO="${GO:-go}"
MODULE=github.com/coredns/coredns
VERSION=v1.15.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/enimasq/coredns-${VERSION}"

if [ "${1:-}" = "-dir" ]; then
	echo "$dir"
	exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

ldflags="-s -w -X $MODULE/coremain.GitCommit=$VERSION"
stamp="$(echo "$MODULE@$VERSION $ldflags" | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/coredns" ] && [ "$(cat "$dir/coredns.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "coredns: cached in $dir"
	exit 0
fi
echo "coredns: building $MODULE@$VERSION into $dir (cold: minutes)"
start=$SECONDS
rm -rf "$dir/.gobin"
# go install PKG@VERSION ignores the module of the working directory. (It
# refuses a module with replace directives: should a later CoreDNS have
# one, build in a copy of the module's directory from the module cache,
# `go mod download -json MODULE@VERSION`, instead.)
(cd "$dir" && GOBIN="$dir/.gobin" GOFLAGS=-mod=readonly CGO_ENABLED=0 \
	"$GO" install -trimpath -ldflags "$ldflags" "$MODULE@$VERSION")
mv -f "$dir/.gobin/coredns" "$dir/coredns"
rm -rf "$dir/.gobin"
echo "$stamp" >"$dir/coredns.stamp"
echo "coredns: built in $((SECONDS - start))s"
