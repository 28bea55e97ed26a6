#!/usr/bin/env bash
# Builds CoreDNS (github.com/coredns/coredns v1.15.0, with the plugins the
# tests' Corefile uses: main.go in this module) from the Go module proxy
# for the tests that need a real resolver (test/coredns_helpers_test.go),
# once, and caches it.
#
#   test/k8stest/coredns-build/build.sh        build what is missing or stale
#   test/k8stest/coredns-build/build.sh -dir   print the cache directory
#
# Cache: ${XDG_CACHE_HOME:-~/.cache}/enimasq/coredns-v1.15.0 (the tests
# compute the same path), holding `coredns` and its stamp (the hash of this
# module's go.mod, go.sum and main.go and the link flags: a change of those
# rebuilds it, otherwise it is found cached in well under a second).
#
# Its own module (go.mod, go.sum: the dependency versions CoreDNS pins),
# outside the main module's graph. The whole of CoreDNS (every plugin,
# Kubernetes' and the clouds' clients) took about 9 minutes cold on 2
# cores; these three plugins about a minute or two. Concurrent runs wait
# for each other (flock).
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

here="$(cd "$(dirname "$0")" && pwd)"
ldflags="-s -w -X $MODULE/coremain.GitCommit=$VERSION"
stamp="$( (cat "$here/go.mod" "$here/go.sum" "$here/main.go"; echo "$ldflags") | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/coredns" ] && [ "$(cat "$dir/coredns.stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "coredns: cached in $dir"
	exit 0
fi
got="$(cd "$here" && "$GO" list -m -f '{{.Version}}' "$MODULE")"
if [ "$got" != "$VERSION" ]; then
	echo "$here/go.mod requires $MODULE $got, this script builds $VERSION: change both" >&2
	exit 1
fi
echo "coredns: building $MODULE@$VERSION (bind, errors, file) into $dir (cold: a minute or two)"
start=$SECONDS
(cd "$here" && GOFLAGS=-mod=readonly CGO_ENABLED=0 \
	"$GO" build -trimpath -ldflags "$ldflags" -o "$dir/.coredns.tmp" .)
mv -f "$dir/.coredns.tmp" "$dir/coredns"
echo "$stamp" >"$dir/coredns.stamp"
echo "coredns: built in $((SECONDS - start))s"
