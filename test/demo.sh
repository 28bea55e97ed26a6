#!/usr/bin/env bash
# make demo: the agent in its own network and mount namespace on the sample
# inputs. Everything it makes (netns, bpffs mount, sockets, process, temp
# files) goes away when the script ends, also on Ctrl-C.
set -euo pipefail

if [ "${ENIMASQ_DEMO_NS:-}" != 1 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "make demo needs root (network namespace, bpffs)" >&2
		exit 1
	fi
	# A private network and mount namespace: the bpffs mount and the netns die
	# with the last process in them.
	exec unshare --net --mount --propagation private env ENIMASQ_DEMO_NS=1 "$0" "$@"
fi

here=$(cd "$(dirname "$0")/.." && pwd)
bin="${ENIMASQ_BIN:-$here/bin}"
samples="${SAMPLES:-$here/test/testdata/samples}"
work=$(mktemp -d "${TMPDIR:-/tmp}/enimasq-demo.XXXXXX")
agent_pid=""
holders=()

cleanup() {
	for pid in "${holders[@]}"; do kill "$pid" 2>/dev/null || true; done
	if [ -n "$agent_pid" ] && kill -0 "$agent_pid" 2>/dev/null; then
		kill -TERM "$agent_pid" 2>/dev/null || true
		wait "$agent_pid" 2>/dev/null || true
	fi
	umount "$work/bpf" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
dbg() { echo "\$ enimasq-dbg $*"; "$bin/enimasq-dbg" --state-dir "$work/state" "$@"; }

ip link set lo up
mkdir -p "$work/bpf" "$work/config"
mount -t bpf bpffs "$work/bpf"

config="$work/config/ip-masq-agent"
cp "$samples/ip-masq-agent.yaml" "$config"
mkdir -p "$work/node" "$work/cni" "$work/pe"
cp "$samples/policyendpoint-v6-except.yaml" "$work/pe/"
cp "$samples/ciliumnode.yaml" "$work/node/ciliumnode.yaml"

# The node's ENIs: links with the MACs of the sample CiliumNode (veths: the
# other end stands for the VPC).
ip link add eni0 address 0a:58:0a:82:00:0a type veth peer name vpc0
ip link add eni1 address 0a:58:0a:82:64:0a type veth peer name vpc1
ip link add eni2 address 0a:58:0a:82:70:0a type veth peer name vpc2
for l in eni0 eni1 eni2 vpc0 vpc1 vpc2; do ip link set "$l" up; done

step "Starting enimasq-agent in a fresh network namespace (log: $work/agent.log)"
echo "ip-masq-agent config: $samples/ip-masq-agent.yaml"
"$bin/enimasq-agent" --state-dir "$work/state" --bpf-root "$work/bpf" \
	--enable-ip-masq-agent --enable-bpf-masquerade --ip-masq-agent-config-path "$config" \
	--ciliumnode-path "$work/node/ciliumnode.yaml" \
	--enable-network-policy --policy-endpoints-path "$work/pe" \
	"$@" >"$work/agent.log" 2>&1 &
agent_pid=$!

for _ in $(seq 1 150); do
	"$bin/enimasq-dbg" --state-dir "$work/state" health >/dev/null 2>&1 && break
	kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log"; exit 1; }
	sleep 0.1
done

# wait_for CMD...: retry a check for up to 10 s.
wait_for() {
	for _ in $(seq 1 100); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "timed out waiting for: $*" >&2
	return 1
}
has_cidr() { "$bin/enimasq-dbg" --state-dir "$work/state" statedb dump ip-masq-agent-cidrs | grep -q "\"$1\""; }

step "Module health"
dbg health

step "Tables"
dbg shell -- db

probe="10.1.2.3 172.20.0.1 100.200.0.1 8.8.8.8 169.254.169.254"
maps() {
	dbg shell -- db/show masq-map-entries
	dbg bpf --bpf-root "$work/bpf" ipmasq list
	echo "masquerade decision of the datapath program on these maps:"
	dbg bpf --bpf-root "$work/bpf" ipmasq decide $probe
}
in_map() { "$bin/enimasq-dbg" bpf --bpf-root "$work/bpf" ipmasq list | grep -q " $1\$"; }
not_in_map() { ! in_map "$1"; }

step "Non-masquerade CIDRs from the sample config"
wait_for has_cidr 10.0.0.0/8
dbg shell -- db/show ip-masq-agent-cidrs

step "The ipmasq BPF maps (IPv4-only node: fe80::/10 is skipped, no v6 map)"
wait_for in_map 10.0.0.0/8
maps

step "Editing the config: a peered VPC (100.200.0.0/16) joins, 172.16.0.0/12 leaves"
sed -e 's|^- 172.16.0.0/12$|- 100.200.0.0/16|' "$config" >"$config.tmp"
mv "$config.tmp" "$config"
cat "$config"
wait_for has_cidr 100.200.0.0/16
dbg shell -- db/show ip-masq-agent-cidrs
wait_for in_map 100.200.0.0/16
wait_for not_in_map 172.16.0.0/12
maps

step "Network policy: the sample PolicyEndpoint (an IPv6 ipBlock with excepts) on an IPv4-only node"
cat "$work/pe/policyendpoint-v6-except.yaml" | sed -n '/^spec:/,$p'
has_policy() { "$bin/enimasq-dbg" --state-dir "$work/state" shell -- db/show policy-map-entries | grep -q Done; }
wait_for has_policy
dbg shell -- db/show policy-endpoints
dbg shell -- db/show policy-map-entries
dbg bpf --bpf-root "$work/bpf" policy list
echo "verdicts of the datapath program on these maps (fe80::/10 left no trace: 254.128.0.1 is denied):"
verdict() { dbg policy verdict --bpf-root "$work/bpf" --pod 10.130.100.133 --direction egress "$@"; }
verdict --peer 10.130.112.20 --proto tcp --port 8080
verdict --peer 10.1.2.3 --proto udp --port 53
verdict --peer 10.130.5.5 --proto udp --port 53
verdict --peer 254.128.0.1 --proto tcp --port 443

step "ENI IPAM: three pods created with the CNI plugin (enimasq-cni, driven by cnitool)"
# The example network configuration of Documentation/cni.md, on this agent's socket.
sed -e "s|/var/run/enimasq/enimasq.sock|$work/state/enimasq.sock|" \
	"$here/Documentation/examples/10-enimasq.conflist" >"$work/cni/10-enimasq.conflist"
cnitool() {
	CNI_PATH="$bin" NETCONFPATH="$work/cni" CNI_CONTAINERID="$2" \
		CNI_ARGS="K8S_POD_NAMESPACE=shop;K8S_POD_NAME=$2" "$bin/cnitool" "$1" enimasq "$3"
}
pods=(web-1 web-2 db-1)
declare -A podns
for pod in "${pods[@]}"; do
	unshare --net sleep 3600 &
	holders+=($!)
	podns[$pod]=/proc/$!/ns/net
	echo "\$ cnitool add enimasq (pod shop/$pod)"
	cnitool add "$pod" "${podns[$pod]}" | grep -E '"(address|name)"' | tr -d ' ,' | paste -sd' '
done
dbg ipam list
echo "\$ ip rule"
ip rule
echo "\$ ip route show table 11"
ip route show table 11

step "A peered VPC joins the config (198.18.0.0/15): every running pod gets its rule"
sed -e 's|^- 10.0.0.0/8$|- 10.0.0.0/8\n- 198.18.0.0/15|' "$config" >"$config.tmp"
mv "$config.tmp" "$config"
has_rule() { ip rule | grep -q "to 198.18.0.0/15"; }
wait_for has_rule
echo "\$ ip rule | grep 198.18.0.0/15"
ip rule | grep 198.18.0.0/15
dbg shell -- db/show eni-rules

step "The pods go: their rules go"
for pod in "${pods[@]}"; do
	echo "\$ cnitool del enimasq (pod shop/$pod)"
	cnitool del "$pod" "${podns[$pod]}"
done
echo "\$ ip rule"
ip rule

step "An invalid edit: the rows stay, health says why"
printf 'nonMasqueradeCIDRs: [10.0.0.0/8, 10.0.0.0/33]\n' >"$config.tmp"
mv "$config.tmp" "$config"
wait_for sh -c "! '$bin/enimasq-dbg' --state-dir '$work/state' health"
dbg health || true
dbg shell -- db/show ip-masq-agent-cidrs
dbg bpf --bpf-root "$work/bpf" ipmasq list

step "statedb dump ip-masq-agent-cidrs"
dbg statedb dump ip-masq-agent-cidrs

step "Stopping the agent"
kill -TERM "$agent_pid"
wait "$agent_pid" || { echo "agent exited with $?"; tail -20 "$work/agent.log"; exit 1; }
agent_pid=""
echo "agent stopped; sockets left: $(ls "$work/state" | grep -c sock || true)"
