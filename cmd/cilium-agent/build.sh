#!/usr/bin/env bash
# Builds Cilium v1.20.2's cilium-agent with enimasq's cells (this module) into
# OUT (default bin/cilium-agent), and caches it the way test/k8stest caches the
# API server: the binary is kept in ${XDG_CACHE_HOME:-~/.cache}/enimasq/
# cilium-agent with a stamp holding the hash of both modules' go.mod and
# go.sum and of every non-test Go source; an unchanged tree copies it in well
# under a second. A changed tree rebuilds, and the Go build cache keeps
# Cilium's own packages: cold, 10-20 minutes on 2 cores; after, the link and
# enimasq's packages (tens of seconds).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
GO="${GO:-go}"
out="${1:-$root/bin/cilium-agent}"
dir="${ENIMASQ_CILIUM_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/enimasq/cilium-agent}"

mkdir -p "$dir" "$(dirname "$out")"
exec 9>"$dir/.lock"
flock 9

stamp="$(cd "$root" && find . -path ./.git -prune -o \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -type f -print |
	LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)"
if [ -x "$dir/cilium-agent" ] && [ "$(cat "$dir/cilium-agent.stamp" 2>/dev/null)" = "$stamp" ]; then
	cp -f "$dir/cilium-agent" "$out"
	echo "cilium-agent: cached in $dir"
	exit 0
fi
echo "cilium-agent: building $here into $out (cold: 10-20 minutes)"
start=$SECONDS
(cd "$here" && "$GO" build -o "$dir/.cilium-agent.tmp" .)
mv -f "$dir/.cilium-agent.tmp" "$dir/cilium-agent"
echo "$stamp" >"$dir/cilium-agent.stamp"
cp -f "$dir/cilium-agent" "$out"
echo "cilium-agent: built in $((SECONDS - start))s"
