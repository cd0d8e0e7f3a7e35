#!/usr/bin/env bash
# Run a command on a bandwidth-limited network on one machine.
#
#   sudo scripts/shaped_network.sh --rate 1gbit [--burst 256kb] -- COMMAND [ARGS...]
#
# Creates a fresh network namespace whose only interface is its own loopback, shapes that
# loopback with a token-bucket filter (tc tbf: RATE, BURST, latency 100ms), and runs COMMAND
# inside it. All ranks of a job started there share that one link, like hosts on a shared
# segment. Loopback moves gigabytes per second and hides what sparse synchronization is for;
# this puts the network back into the measurement.
#
# MPI ranks on one host normally talk through shared memory, which bypasses any network. For
# MPICH (the mpich wheel: ch4 with ofi) the command gets MPIR_CVAR_NOLOCAL=1 (no shared memory
# between ranks), MPIR_CVAR_CH4_NETMOD=ofi and FI_PROVIDER=tcp (TCP sockets), so every message
# crosses the shaped loopback. A value the caller already set for the last two wins;
# MPIR_CVAR_NOLOCAL is always 1, since without it the traffic would not cross the link that the
# rate describes. torch.distributed's Gloo backend always uses TCP and needs nothing.
# SPARDL_NETWORK_RATE=RATE is exported so that the bench and the trainer record the network
# they ran on.
#
# COMMAND's exit status is passed through. The namespace is removed on every exit; SIGINT and
# SIGTERM are forwarded to COMMAND, whose exit then ends the script. Needs root, ip and tc
# (iproute2); without them: one message and exit status 2, as for bad arguments.
set -u

readonly PROG=shaped_network.sh

usage_text() {
    cat <<EOF
usage: $PROG --rate RATE [--burst SIZE] -- COMMAND [ARGS...]
  --rate RATE    link rate in tc's units: 100mbit, 1gbit, 10gbit, 500kbit, 12.5mbps ...
  --burst SIZE   token-bucket size in bytes, tc's units: 256kb (default), 1mb, 64k ...
EOF
}

usage() {  # a usage error: the message and the usage on stderr, exit status 2
    [ $# -gt 0 ] && echo "$PROG: $1" >&2
    usage_text >&2
    exit 2
}

rate="" burst=256kb
while [ $# -gt 0 ]; do
    case "$1" in
        --rate) [ $# -ge 2 ] || usage "--rate needs a value"; rate=$2; shift 2 ;;
        --rate=*) rate=${1#--rate=}; shift ;;
        --burst) [ $# -ge 2 ] || usage "--burst needs a value"; burst=$2; shift 2 ;;
        --burst=*) burst=${1#--burst=}; shift ;;
        -h|--help) usage_text; exit 0 ;;
        --) shift; break ;;
        *) usage "unknown argument '$1' (the command goes after --)" ;;
    esac
done
[ -n "$rate" ] || usage "--rate is required"
[[ "$rate" =~ ^[0-9]+(\.[0-9]+)?([kKmMgGtT]?(bit|bps))$ ]] || \
    usage "bad --rate '$rate': a number with a unit bit, kbit, mbit, gbit, tbit or bps, kbps, mbps, gbps"
[[ "$burst" =~ ^[0-9]+([kKmMgG]?[bB]?|[kKmMgG]?bit)$ ]] || \
    usage "bad --burst '$burst': a byte count such as 256kb, 1mb or 65536"
[ $# -gt 0 ] || usage "no command given after --"

if [ "$(id -u)" -ne 0 ]; then
    echo "$PROG: needs root to create and shape a network namespace (run it with sudo)" >&2
    exit 2
fi
for tool in ip tc; do
    if ! command -v "$tool" >/dev/null; then
        echo "$PROG: '$tool' not found; install iproute2" >&2
        exit 2
    fi
done

namespace="spardl-shaped-$$-$RANDOM"
child=""
pending=""  # a signal that came before COMMAND's process id was known
cleanup() {
    ip netns delete "$namespace" 2>/dev/null
}
forward() {  # $1: the signal to pass on to COMMAND (the script ends when COMMAND does)
    if [ -n "$child" ]; then kill -s "$1" "$child" 2>/dev/null; else pending="$1"; fi
}
trap cleanup EXIT
trap 'forward INT' INT
trap 'forward TERM' TERM

if ! ip netns add "$namespace"; then
    echo "$PROG: could not create network namespace $namespace" >&2
    exit 2
fi
if ! ip netns exec "$namespace" ip link set lo up ||
   ! ip netns exec "$namespace" tc qdisc add dev lo root tbf rate "$rate" burst "$burst" latency 100ms; then
    echo "$PROG: could not shape the loopback of $namespace to rate $rate, burst $burst (see tc's message above)" >&2
    exit 2
fi

export SPARDL_NETWORK_RATE="$rate"
export MPIR_CVAR_NOLOCAL=1
export MPIR_CVAR_CH4_NETMOD="${MPIR_CVAR_CH4_NETMOD:-ofi}"
export FI_PROVIDER="${FI_PROVIDER:-tcp}"

# In the background, so that this shell can forward signals while it waits; a background job
# of a script ignores SIGINT unless it resets that, which the subshell does before the exec.
( trap - INT QUIT; exec ip netns exec "$namespace" "$@" ) &
child=$!
# On a busy machine COMMAND can start (and be signalled) before this shell has its process id.
[ -z "$pending" ] || kill -s "$pending" "$child" 2>/dev/null
while kill -0 "$child" 2>/dev/null; do  # wait also returns when a trapped signal arrives
    wait "$child"
done
wait "$child"  # COMMAND's exit status (bash keeps it after the process is gone)
