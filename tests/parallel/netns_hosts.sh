# Two hosts on one machine for the tests: network namespaces ("hosts" 10.231.0.1 and
# 10.231.0.2, each with its own loopback) joined by a veth pair. A host's /etc/hosts can
# name its peers (as a cluster's DNS would): ip netns exec mounts /etc/netns/NAME/hosts
# over /etc/hosts.
# Usage: source netns_hosts.sh; make_hosts || exit 77 (it says why); run in host k with
#        `ip netns exec "${hosts[$k]}" ...`; remove_hosts (in the caller's EXIT trap).

tag=$$
hosts=(tide-a-$tag tide-b-$tag)
addresses=(10.231.0.1 10.231.0.2)
veths=(veth-a-$tag veth-b-$tag)

make_hosts() {
  local err="not root, or no ip command"
  if [[ $(id -u) -ne 0 ]] || ! command -v ip > /dev/null || ! err=$(ip netns add "${hosts[0]}" 2>&1); then
    echo "skipped: network namespaces need root and iproute2 ($err)"
    return 1
  fi
  ip netns add "${hosts[1]}"
  ip link add "${veths[0]}" netns "${hosts[0]}" type veth peer name "${veths[1]}" netns "${hosts[1]}"
  local i
  for i in 0 1; do
    ip -n "${hosts[$i]}" addr add "${addresses[$i]}/24" dev "${veths[$i]}"
    ip -n "${hosts[$i]}" link set "${veths[$i]}" up
    ip -n "${hosts[$i]}" link set lo up
  done
}

# name_hosts NAME0 NAME1: both hosts resolve NAMEk to host k's address.
name_hosts() {
  local h
  for h in "${hosts[@]}"; do
    mkdir -p "/etc/netns/$h"
    printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "${addresses[0]}" "$1" "${addresses[1]}" "$2" > "/etc/netns/$h/hosts"
  done
}

remove_hosts() {
  local h
  for h in "${hosts[@]}"; do
    ip netns pids "$h" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$h" 2>/dev/null || true
    rm -rf "/etc/netns/$h"
  done
}
