#!/usr/bin/env bash
# Run a command on a cluster of hosts simulated on one machine: one network namespace per host,
# all joined to a switch, each host's link bandwidth-limited in both directions.
#
#   sudo scripts/cluster_network.sh --hosts N [--ranks-per-host G] (--rate R | --rates R1,...,RN)
#       [--burst SIZE] [--delay T] -- COMMAND [ARGS...]
#
# e.g. 2 hosts with 2 ranks each on 1 Gbit/s links:
#
#   sudo scripts/cluster_network.sh --hosts 2 --ranks-per-host 2 --rate 1gbit -- \
#       .venv/bin/mpiexec -n 4 .venv/bin/python scripts/bench_allreduce.py ...
#
# The network. The switch is a bridge (br0, 169.254.77.254/24) in a namespace of its own. Host i
# (0 <= i < N) is a namespace whose interface eth0 (169.254.77.<i+1>/24) is one end of a veth
# pair whose other end (h<i>) is a port of the bridge. Both ends are shaped with a token-bucket
# filter (tc tbf: the host's rate, BURST, latency 100ms): eth0 limits what the host sends, h<i>
# what it receives, so a transfer between two hosts runs at the slower of their rates. Every
# interface is created inside these namespaces (none ever appears in the machine's own), and
# 169.254.0.0/16 is link-local: nothing here routes anywhere else, no traffic leaves the
# machine. Each host has its own host name, host<i> (a UTS namespace), and an /etc/hosts
# (ip netns exec's /etc/netns/NAMESPACE/hosts) that names all the hosts.
#
# Where COMMAND runs, and how ranks reach their hosts. COMMAND runs as written, unchanged:
#  - MPICH's mpiexec (Hydra) and any other command run once, in the switch's namespace, the
#    launch node of the cluster, which holds no ranks. Hydra is pointed at the hosts through its
#    environment: HYDRA_HOST_FILE lists "169.254.77.<i+1>:G" for each host, so rank r runs on
#    host r // G (ranks beyond N*G wrap around to host 0, as Hydra does), and HYDRA_LAUNCHER=ssh
#    with HYDRA_LAUNCHER_EXEC set to a small stand-in for ssh, written into a temporary folder,
#    that starts each host's hydra_pmi_proxy inside that host's namespace (ip netns exec, then
#    unshare --uts for the host name). The proxy starts the host's ranks there, before MPI
#    initialises; HYDRA_IFACE=br0 makes the proxies call mpiexec back over the switch. Options
#    written in COMMAND win over these variables: -hosts, -f, -ppn or -launcher there would
#    change the placement. Hydra's node map tells MPICH which ranks share a host: ranks on one
#    host talk through shared memory, ranks on different hosts TCP (MPIR_CVAR_CH4_NETMOD=ofi,
#    FI_PROVIDER=tcp, as the caller set them or these defaults; FI_TCP_IFACE=eth0), over the
#    shaped links. MPIR_CVAR_NOLOCAL=1 set by the caller is kept: every rank then talks TCP, and
#    ranks of one host over the host's own, unshaped, loopback.
#  - torchrun (or python -m torch.distributed.run) runs once on each host, in its namespace,
#    with the cluster given through the PET_* variables torchrun reads for options the command
#    leaves out: PET_NNODES=N, PET_NPROC_PER_NODE=G, PET_NODE_RANK=i, PET_MASTER_ADDR=host 0's
#    address, PET_MASTER_PORT=29500; its ranks are node_rank * G + local_rank, so again rank r
#    is on host r // G. GLOO_SOCKET_IFNAME=eth0 makes Gloo talk over the host's link (ranks on
#    one host reach each other over the host's own, unshaped, loopback). Leave --nnodes,
#    --node-rank, --nproc-per-node and --master-* out of COMMAND (or give the same values).
#    The exit status is the first non-zero one in host order, else 0.
#
# The command gets SPARDL_CLUSTER, the topology as one line of JSON, for the bench and the
# trainer to record:
#   {"hosts":2,"ranks_per_host":2,"rates":["1gbit","1gbit"],"delay":null}
# ("delay": the --delay value as written, or null), and SPARDL_NETWORK_RATE, the slowest of the
# rates as written (the common rate when all are the same), as scripts/shaped_network.sh sets.
#
# --delay adds T to every packet a host sends (a round trip between two hosts: 2T), which needs
# tc's netem qdisc; no other qdisc delays packets, and where netem is missing (as on some
# kernels) --delay is refused.
#
# COMMAND's exit status is passed through. Every namespace (with the links and the bridge in
# them, and any process left there), the /etc/netns entries and the temporary folder are
# removed on every exit; SIGINT and SIGTERM are forwarded to COMMAND, whose exit then ends the
# script. Names carry this script's process id, so concurrent runs neither collide nor remove
# each other's. Needs root, ip and tc (iproute2), unshare and hostname; without them, or on bad
# arguments: one message and exit status 2.
set -u

readonly PROG=cluster_network.sh
readonly SUBNET=169.254.77  # host i: .<i+1>, the switch: .254
readonly MAX_HOSTS=250

usage_text() {
    cat <<EOF
usage: $PROG --hosts N [--ranks-per-host G] (--rate RATE | --rates R1,...,RN) [--burst SIZE] [--delay T] -- COMMAND [ARGS...]
  --hosts N           number of hosts, 1 to $MAX_HOSTS
  --ranks-per-host G  ranks on each host (default 1): rank r runs on host r // G
  --rate RATE         every host's link rate in tc's units: 100mbit, 1gbit, 10gbit, 12.5mbps ...
  --rates R1,...,RN   one rate for each host's link
  --burst SIZE        token-bucket size in bytes, tc's units: 256kb (default), 1mb, 64k ...
  --delay T           one-way delay added to what each host sends: 100us, 2ms ... (needs netem)
EOF
}

usage() {  # a usage error: the message and the usage on stderr, exit status 2
    [ $# -gt 0 ] && echo "$PROG: $1" >&2
    usage_text >&2
    exit 2
}

fail() {  # one message, exit status 2
    echo "$PROG: $1" >&2
    exit 2
}

hosts="" per_host=1 rate="" rates="" burst=256kb delay=""
while [ $# -gt 0 ]; do
    case "$1" in
        --hosts) [ $# -ge 2 ] || usage "--hosts needs a value"; hosts=$2; shift 2 ;;
        --hosts=*) hosts=${1#--hosts=}; shift ;;
        --ranks-per-host) [ $# -ge 2 ] || usage "--ranks-per-host needs a value"; per_host=$2; shift 2 ;;
        --ranks-per-host=*) per_host=${1#--ranks-per-host=}; shift ;;
        --rate) [ $# -ge 2 ] || usage "--rate needs a value"; rate=$2; shift 2 ;;
        --rate=*) rate=${1#--rate=}; shift ;;
        --rates) [ $# -ge 2 ] || usage "--rates needs a value"; rates=$2; shift 2 ;;
        --rates=*) rates=${1#--rates=}; shift ;;
        --burst) [ $# -ge 2 ] || usage "--burst needs a value"; burst=$2; shift 2 ;;
        --burst=*) burst=${1#--burst=}; shift ;;
        --delay) [ $# -ge 2 ] || usage "--delay needs a value"; delay=$2; shift 2 ;;
        --delay=*) delay=${1#--delay=}; shift ;;
        -h|--help) usage_text; exit 0 ;;
        --) shift; break ;;
        *) usage "unknown argument '$1' (the command goes after --)" ;;
    esac
done
[ -n "$hosts" ] || usage "--hosts is required"
[[ "$hosts" =~ ^[1-9][0-9]*$ ]] && [ "$hosts" -le "$MAX_HOSTS" ] || \
    usage "bad --hosts '$hosts': a whole number from 1 to $MAX_HOSTS"
[[ "$per_host" =~ ^[1-9][0-9]{0,5}$ ]] || \
    usage "bad --ranks-per-host '$per_host': a whole number from 1"
if [ -n "$rate" ] && [ -n "$rates" ]; then
    usage "give --rate or --rates, not both"
elif [ -n "$rate" ]; then
    link_rates=()
    for ((i = 0; i < hosts; i++)); do link_rates+=("$rate"); done
elif [ -n "$rates" ]; then
    IFS=, read -r -a link_rates <<<"$rates"
    [[ "$rates" != *, ]] && [ "${#link_rates[@]}" -eq "$hosts" ] || \
        usage "bad --rates '$rates': $hosts rates, one for each host, separated by commas"
else
    usage "--rate or --rates is required"
fi
for r in "${link_rates[@]}"; do
    [[ "$r" =~ ^[0-9]+(\.[0-9]+)?([kKmMgGtT]?(bit|bps))$ ]] || \
        usage "bad rate '$r': a number with a unit bit, kbit, mbit, gbit, tbit or bps, kbps, mbps, gbps"
done
[[ "$burst" =~ ^[0-9]+([kKmMgG]?[bB]?|[kKmMgG]?bit)$ ]] || \
    usage "bad --burst '$burst': a byte count such as 256kb, 1mb or 65536"
[ -z "$delay" ] || [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(us|usec|ms|msec|s|sec|secs)$ ]] || \
    usage "bad --delay '$delay': a time such as 100us, 2ms or 0.5s"
[ $# -gt 0 ] || usage "no command given after --"

[ "$(id -u)" -eq 0 ] || \
    fail "needs root to create and shape network namespaces (run it with sudo)"
for tool in ip tc unshare hostname; do
    command -v "$tool" >/dev/null || fail "'$tool' not found; install iproute2 and util-linux"
done

# The slowest rate in bits per second, as tc reads the units (kbit: 1000 bit/s, kbps: 1000 B/s).
slowest=$(for r in "${link_rates[@]}"; do echo "$r"; done | awk '
    { v = $0; sub(/[a-zA-Z]+$/, "", v); u = tolower(substr($0, length(v) + 1))
      f = (u ~ /bps$/) ? 8 : 1; p = substr(u, 1, 1)
      f *= (p == "k") ? 1e3 : (p == "m") ? 1e6 : (p == "g") ? 1e9 : (p == "t") ? 1e12 : 1
      if (NR == 1 || v * f < best) { best = v * f; name = $0 } }
    END { print name }')

prefix="spardl-c$$-$RANDOM"
switch="$prefix-sw"
made=()      # the namespaces made so far, removed on exit
children=()  # COMMAND's process ids
pending=""   # a signal that came before COMMAND's process ids were known
workdir=""
cleanup() {
    local ns pids
    for ns in "${made[@]}"; do  # a rank left behind would keep its namespace alive
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -s KILL $pids 2>/dev/null
    done
    for ns in "${made[@]}"; do
        ip netns delete "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    [ -z "$workdir" ] || rm -rf "$workdir"
}
forward() {  # $1: the signal to pass on to COMMAND (the script ends when COMMAND does)
    if [ ${#children[@]} -gt 0 ]; then
        kill -s "$1" "${children[@]}" 2>/dev/null
    else
        pending="$1"
    fi
}
trap cleanup EXIT
trap 'forward INT' INT
trap 'forward TERM' TERM

in_ns() {  # in_ns NAMESPACE COMMAND...
    ip netns exec "$@"
}
new_namespace() {  # new_namespace NAME: with its loopback up and /etc/hosts naming the hosts
    ip netns add "$1" || fail "could not create network namespace $1"
    made+=("$1")
    in_ns "$1" ip link set lo up || fail "could not bring up the loopback of $1"
    mkdir -p "/etc/netns/$1" && printf '%s\n' "${host_lines[@]}" >"/etc/netns/$1/hosts" ||
        fail "could not write /etc/netns/$1/hosts"
}

host_lines=("127.0.0.1 localhost" "$SUBNET.254 switch")
for ((i = 0; i < hosts; i++)); do  # IPv4-mapped too: servers listening on IPv6 see those
    host_lines+=("$SUBNET.$((i + 1)) host$i" "::ffff:$SUBNET.$((i + 1)) host$i")
done

new_namespace "$switch"
if [ -n "$delay" ] && ! in_ns "$switch" tc qdisc add dev lo root netem delay "$delay" 2>/dev/null; then
    fail "--delay needs tc's netem qdisc, which this kernel lacks (no other qdisc delays packets); run without --delay"
fi
[ -z "$delay" ] || in_ns "$switch" tc qdisc del dev lo root
in_ns "$switch" ip link add br0 type bridge &&
    in_ns "$switch" ip addr add "$SUBNET.254/24" dev br0 &&
    in_ns "$switch" ip link set br0 up || fail "could not create the switch (a bridge) in $switch"

for ((i = 0; i < hosts; i++)); do
    ns="$prefix-h$i" r=${link_rates[$i]}
    new_namespace "$ns"
    ip link add name eth0 netns "$ns" type veth peer name "h$i" netns "$switch" &&
        in_ns "$ns" ip addr add "$SUBNET.$((i + 1))/24" dev eth0 &&
        in_ns "$ns" ip link set eth0 up &&
        in_ns "$switch" ip link set "h$i" master br0 up ||
        fail "could not link host $i ($ns) to the switch"
    for end in "$ns eth0" "$switch h$i"; do
        read -r where dev <<<"$end"
        in_ns "$where" tc qdisc add dev "$dev" root handle 1: tbf rate "$r" burst "$burst" latency 100ms ||
            fail "could not shape $dev in $where to rate $r, burst $burst (see tc's message above)"
    done
    if [ -n "$delay" ]; then
        in_ns "$ns" tc qdisc add dev eth0 parent 1:1 handle 10: netem delay "$delay" limit 100000 ||
            fail "could not delay eth0 of $ns by $delay (see tc's message above)"
    fi
done

workdir=$(mktemp -d "${TMPDIR:-/tmp}/$prefix.XXXXXX") || fail "could not create a temporary folder"
for ((i = 0; i < hosts; i++)); do echo "$SUBNET.$((i + 1)):$per_host"; done >"$workdir/hosts"
# Hydra calls it as ssh: rsh [OPTIONS] HOST COMMAND..., COMMAND one shell command line.
cat >"$workdir/rsh" <<EOF
#!/bin/sh
# Hydra's ssh for $PROG: runs the command line on a host, in the host's namespaces.
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
case "\$1" in
    $SUBNET.[0-9]*) i=\$((\${1##*.} - 1)) ;;
    *) echo "$PROG: no host \$1 in this cluster" >&2; exit 255 ;;
esac
shift
exec ip netns exec "$prefix-h\$i" unshare --uts sh -c "hostname host\$i && exec \$*"
EOF
chmod +x "$workdir/rsh" || fail "could not write $workdir/rsh"

rate_list=$(printf '"%s",' "${link_rates[@]}")
export SPARDL_CLUSTER="{\"hosts\":$hosts,\"ranks_per_host\":$per_host,\"rates\":[${rate_list%,}],\"delay\":$([ -n "$delay" ] && echo "\"$delay\"" || echo null)}"
export SPARDL_NETWORK_RATE="$slowest"
export MPIR_CVAR_CH4_NETMOD="${MPIR_CVAR_CH4_NETMOD:-ofi}"
export FI_PROVIDER="${FI_PROVIDER:-tcp}"
export FI_TCP_IFACE=eth0
export GLOO_SOCKET_IFNAME=eth0
export HYDRA_HOST_FILE="$workdir/hosts"
export HYDRA_LAUNCHER=ssh
export HYDRA_LAUNCHER_EXEC="$workdir/rsh"
export HYDRA_IFACE=br0

per_host_command=""
case "$(basename "$1")" in
    torchrun|torchrun-*) per_host_command=1 ;;
    python*) [ $# -ge 3 ] && [ "$2" = -m ] && [ "$3" = torch.distributed.run ] && per_host_command=1 ;;
esac

# A signal while the cluster was being built: stop before COMMAND starts.
[ -z "$pending" ] || exit $((128 + $(kill -l "$pending")))

# In the background, so that this shell can forward signals while it waits; a background job
# of a script ignores SIGINT unless it resets that, which the subshell does before the exec.
if [ -n "$per_host_command" ]; then
    for ((i = 0; i < hosts; i++)); do
        (
            trap - INT QUIT
            export PET_NNODES="$hosts" PET_NPROC_PER_NODE="$per_host" PET_NODE_RANK="$i"
            export PET_MASTER_ADDR="$SUBNET.1" PET_MASTER_PORT=29500
            exec ip netns exec "$prefix-h$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host$i" "$@"
        ) &
        children+=($!)
    done
else
    ( trap - INT QUIT; exec ip netns exec "$switch" "$@" ) &
    children+=($!)
fi
# On a busy machine COMMAND can start (and be signalled) before this shell has its process id.
[ -z "$pending" ] || kill -s "$pending" "${children[@]}" 2>/dev/null
status=0
for child in "${children[@]}"; do
    while kill -0 "$child" 2>/dev/null; do  # wait also returns when a trapped signal arrives
        wait "$child"
    done
    wait "$child"  # its exit status (bash keeps it after the process is gone)
    code=$?
    [ "$status" -ne 0 ] || status=$code
done
exit "$status"
