#!/usr/bin/env bash
# Builds Cilium v1.20.2's cilium-agent with enimasq's cells (this module) into
# OUT (default bin/cilium-agent), with Cilium's own cilium-cni, cilium-dbg
# and cilium-health-responder (the module's tools) beside it, and caches them the way test/k8stest caches the
# API server: the binary is kept in ${XDG_CACHE_HOME:-~/.cache}/enimasq/
# cilium-agent with a stamp holding the hash of both modules' go.mod and
# go.sum and of every non-test Go source; an unchanged tree copies it in well
# under a second. A changed tree rebuilds, and the Go build cache keeps
# Cilium's own packages: cold, 10-20 minutes on 2 cores; after, the link and
# enimasq's packages (tens of seconds).
#
# Built as Cilium's Makefile builds its binaries (Makefile.defs of v1.20.2):
# CGO_ENABLED=0, the osusergo tag, and pkg/version's ciliumVersion set to
# "VERSION REVISION DATE" (cilium-agent --version, cilium-dbg version):
# Cilium's version from go.mod, enimasq's commit as the revision (or
# $ENIMASQ_REVISION), its author date (or $ENIMASQ_DATE). The image
# (Documentation/deploy/cilium/Dockerfile) builds the agent with this script
# too (ENIMASQ_CILIUM_AGENT_ONLY=1), so it is what the tests ran.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
GO="${GO:-go}"
out="${1:-$root/bin/cilium-agent}"
dir="${ENIMASQ_CILIUM_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/enimasq/cilium-agent}"

mkdir -p "$dir" "$(dirname "$out")"
exec 9>"$dir/.lock"
flock 9

cilium_version="$(cd "$here" && "$GO" list -m -f '{{.Version}}' github.com/cilium/cilium)"
revision="${ENIMASQ_REVISION:-$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)}"
date="${ENIMASQ_DATE:-$(git -C "$root" show -s --format=%aI HEAD 2>/dev/null || echo 1970-01-01T00:00:00Z)}"
ldflags="-X 'github.com/cilium/cilium/pkg/version.ciliumVersion=${cilium_version#v} enimasq-$revision $date'"
export CGO_ENABLED=0
buildflags=(-tags osusergo -ldflags "$ldflags")

stamp="$( (cd "$root" && find . -path ./.git -prune -o \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -type f -print |
	LC_ALL=C sort | xargs sha256sum; echo "CGO_ENABLED=$CGO_ENABLED ${buildflags[*]}") | sha256sum | cut -d' ' -f1)"
outdir="$(dirname "$out")"
# NAME PACKAGE: the agent, then the tools of go.mod, named as Cilium's image
# names them (cilium-health-responder is in the agent's PATH).
bins=(
	"cilium-agent ."
	"cilium-cni github.com/cilium/cilium/plugins/cilium-cni"
	"cilium-dbg github.com/cilium/cilium/cilium-dbg"
	"cilium-health-responder github.com/cilium/cilium/cilium-health/responder"
	# Cilium's own agent, without enimasq's cells: the baseline of make bench.
	"cilium-agent-upstream github.com/cilium/cilium/daemon"
)
if [ -n "${ENIMASQ_CILIUM_AGENT_ONLY:-}" ]; then
	bins=("${bins[0]}")
fi
copy_out() {
	cp -f "$dir/cilium-agent" "$out"
	for b in "${bins[@]:1}"; do
		cp -f "$dir/${b%% *}" "$outdir/"
	done
}
cached() {
	[ "$(cat "$dir/cilium-agent.stamp" 2>/dev/null)" = "$stamp" ] || return 1
	for b in "${bins[@]}"; do
		[ -x "$dir/${b%% *}" ] || return 1
	done
}
if cached; then
	copy_out
	echo "cilium-agent, cilium-cni, cilium-dbg, cilium-health-responder: cached in $dir"
	exit 0
fi
echo "cilium-agent: building $here into $out (cold: 10-20 minutes)"
start=$SECONDS
for b in "${bins[@]}"; do
	name="${b%% *}" pkg="${b#* }"
	(cd "$here" && "$GO" build "${buildflags[@]}" -o "$dir/.$name.tmp" "$pkg")
	mv -f "$dir/.$name.tmp" "$dir/$name"
done
if [ -n "${ENIMASQ_CILIUM_AGENT_ONLY:-}" ]; then
	cp -f "$dir/cilium-agent" "$out"
	exit 0
fi
echo "$stamp" >"$dir/cilium-agent.stamp"
copy_out
echo "cilium-agent and Cilium's tools: built in $((SECONDS - start))s"
