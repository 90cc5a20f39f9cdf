#!/usr/bin/env bash
# Installs rkube on a bare host as systemd services: the binary, the units of the given roles,
# their settings files (written once, never overwritten) and the directories they use. Running
# it again with a newer binary is how a host is upgraded (then restart the service).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: install.sh [OPTIONS] ROLE...

Installs the rkube binary and the systemd units of each ROLE (server, agent), writes
/etc/rkube/ROLE.env from the options below if it does not exist yet (an existing one is kept:
edit it), and makes the directories the services use. Safe to run again; run it with a new
binary to upgrade a host, then `systemctl restart rkube-ROLE`.

Options:
  --bin PATH         the rkube binary to install (default: target/release/rkube of the
                     checkout this script is in)
  --name NAME        this member's or node's name (default: the short host name)
  --address IPV4     the host's address the others reach it on (required for a new .env)
  --init             server: this host makes the cluster (rkube server --init), writing what
                     joining needs to /etc/rkube/join.json (copy it to the other hosts)
  --join-from FILE   server/agent: join with that file (default: /etc/rkube/join.json)
  --servers URLS     agent: the API servers, comma-separated https://HOST:6443 (required for a
                     new agent.env)
  --prefix DIR       where the binary goes: DIR/bin/rkube (default: /usr/local)
  --destdir DIR      stage everything under DIR instead of / (also: DESTDIR=DIR); systemd is
                     not reloaded
  -h, --help         this text

Example (three servers, then agents):
  install.sh server --address 10.0.0.1 --init          # on the first server
  install.sh server --address 10.0.0.2                 # on the others, once join.json is there
  install.sh agent --address 10.0.0.21 \
    --servers https://10.0.0.1:6443,https://10.0.0.2:6443,https://10.0.0.3:6443
EOF
}

die() {
  echo "install.sh: $*" >&2
  exit 2
}

here=$(cd "$(dirname "$0")" && pwd)
bin=""
name=""
address=""
init=false
join_from=""
servers=""
prefix=/usr/local
destdir=${DESTDIR:-}
roles=()

value() { # the option's value, or a clear refusal
  [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"
  printf '%s' "$2"
}

while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --bin) bin=$(value "$@"); shift 2 ;;
    --name) name=$(value "$@"); shift 2 ;;
    --address) address=$(value "$@"); shift 2 ;;
    --init) init=true; shift ;;
    --join-from) join_from=$(value "$@"); shift 2 ;;
    --servers) servers=$(value "$@"); shift 2 ;;
    --prefix) prefix=$(value "$@"); shift 2 ;;
    --destdir) destdir=$(value "$@"); shift 2 ;;
    server | agent) roles+=("$1"); shift ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) die "unknown role '$1': give server, agent or both (see --help)" ;;
  esac
done

[ ${#roles[@]} -gt 0 ] || die "no role given: install.sh server, install.sh agent, or both (see --help)"
has_role() { printf '%s\n' "${roles[@]}" | grep -qx "$1"; }
if $init && ! has_role server; then die "--init makes a cluster: it goes with the server role"; fi
if $init && [ -n "$join_from" ]; then die "--init and --join-from exclude each other: the first server makes the join file, the others read it"; fi
if [ -n "$servers" ] && ! has_role agent; then die "--servers is the agent's list of API servers: it goes with the agent role"; fi

case $prefix in /*) ;; *) die "--prefix must be an absolute path, not '$prefix'" ;; esac
if [ -n "$destdir" ]; then
  mkdir -p "$destdir" || die "cannot create --destdir $destdir"
  destdir=$(cd "$destdir" && pwd)
  [ "$destdir" != / ] || destdir=""
fi

if [ -z "$bin" ]; then
  bin=$here/../../target/release/rkube
  [ -e "$bin" ] || die "no rkube binary at target/release/rkube (build it with cargo build --release -p rkube, or pass --bin PATH)"
fi
[ -f "$bin" ] && [ -x "$bin" ] || die "--bin $bin is not an executable file"
version=$("$bin" --version 2>/dev/null | head -n 1) || true
case $version in rkube\ *) ;; *) die "$bin is not an rkube binary for this machine (its --version says '$version')" ;; esac

[ -n "$name" ] || name=$(hostname -s 2>/dev/null || cat /proc/sys/kernel/hostname)
name=$(printf '%s' "$name" | tr 'A-Z' 'a-z')
[[ $name =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
  die "name '$name' is not a valid node name (lower-case letters, digits and '-', at most 63): pass --name"
if [ -n "$address" ]; then
  [[ $address =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] ||
    die "--address '$address' is not an IPv4 address (for IPv6, edit the .env and the units by hand)"
  for octet in "${BASH_REMATCH[@]:1}"; do
    [ "$octet" -le 255 ] || die "--address '$address' is not an IPv4 address"
  done
fi
if [ -n "$servers" ]; then
  IFS=, read -ra urls <<<"$servers"
  for u in "${urls[@]}"; do
    [[ $u =~ ^https://[^/[:space:]]+:[0-9]+/?$ ]] ||
      die "--servers: '$u' is not an API server URL like https://10.0.0.1:6443"
  done
fi

etc=$destdir/etc/rkube
unitdir=$destdir/etc/systemd/system
state=$destdir/var/lib/rkube
changed=()

# Everything a new settings file needs is checked before anything is written.
for role in "${roles[@]}"; do
  [ -e "$etc/$role.env" ] || [ -n "$address" ] ||
    die "/etc/rkube/$role.env does not exist yet and needs this host's --address"
done
if has_role agent && [ ! -e "$etc/agent.env" ] && [ -z "$servers" ]; then
  die "/etc/rkube/agent.env does not exist yet and needs --servers (the API servers' URLs)"
fi

# install(1) replaces the destination (unlinking it first), so a running binary can be upgraded.
install -d -m 0755 "$destdir$prefix/bin" "$etc" "$unitdir" "$state"
if ! cmp -s "$bin" "$destdir$prefix/bin/rkube"; then
  install -m 0755 "$bin" "$destdir$prefix/bin/rkube"
  changed+=("$prefix/bin/rkube ($version)")
fi

# A unit, with the binary's path for this --prefix.
install_unit() {
  local unit=$1 tmp
  tmp=$(mktemp)
  sed "s|/usr/local/bin/rkube|$prefix/bin/rkube|" "$here/$unit" >"$tmp"
  if ! cmp -s "$tmp" "$unitdir/$unit"; then
    install -m 0644 "$tmp" "$unitdir/$unit"
    changed+=("/etc/systemd/system/$unit")
  fi
  rm -f "$tmp"
}

# A settings file, written once: an existing one is the operator's.
write_env() {
  local file=$1 text=$2
  if [ -e "$file" ]; then
    echo "kept ${file#"$destdir"} (edit it to change this host's settings)"
    return
  fi
  printf '%s\n' "$text" >"$file.tmp"
  chmod 0600 "$file.tmp"
  mv "$file.tmp" "$file"
  changed+=("${file#"$destdir"}")
}

join=${join_from:-/etc/rkube/join.json}
for role in "${roles[@]}"; do
  case $role in
    server)
      install_unit rkube-server.service
      install -d -m 0700 "$etc/pki" "$state/server"
      if $init; then
        how="--init --join-file $join"
      else
        how="--join-from $join"
      fi
      write_env "$etc/server.env" "# rkube server on this host (read by rkube-server.service).
# This member's name (unique in the cluster) and the address the other hosts reach it on: peers
# on :2380, etcd clients on :2379, metrics on :2381, the Kubernetes API on :6443.
RKUBE_NAME=$name
RKUBE_ADDRESS=$address
# More flags of rkube server (rkube server --help), split on spaces. The first server makes the
# cluster with --init --join-file FILE; the others join with --join-from FILE, which is read
# only until this member has joined. Add --cert-sans for names and addresses (a load balancer's)
# that clients use beside RKUBE_ADDRESS, --snapshot-interval 1h for scheduled backups.
RKUBE_SERVER_ARGS=$how
# Log filter (e.g. info, debug, info,rkube_store=debug).
RKUBE_LOG=info"
      ;;
    agent)
      install_unit rkube-agent.service
      install -d -m 0700 "$state/agent"
      write_env "$etc/agent.env" "# rkube agent on this host (read by rkube-agent.service).
# The node's name and address (its InternalIP), and every API server, so that it fails over.
RKUBE_NAME=$name
RKUBE_ADDRESS=$address
RKUBE_SERVERS=$servers
# More flags of rkube agent (rkube agent --help), split on spaces. --join-from FILE supplies the
# bootstrap token and CA pin; it is read at every start, so keep it, or replace it once the
# node has joined by RKUBE_JOIN_TOKEN=... below and --discovery-token-ca-cert-hash sha256:...
# A node that runs containers: --pod-cidr 10.244.N.0/24 --cni-conf-dir /etc/cni/net.d
# (containerd at /run/containerd/containerd.sock); --sim runs none.
RKUBE_AGENT_ARGS=--join-from $join
RKUBE_LOG=info"
      ;;
  esac
done

if [ -z "$destdir" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi

if [ ${#changed[@]} -eq 0 ]; then
  echo "rkube is installed already; nothing changed"
else
  printf 'installed %s\n' "${changed[@]}"
fi
[ -z "$destdir" ] || echo "staged under $destdir (copy it to the host's root as it is, modes included)"
for role in "${roles[@]}"; do
  echo "start it: systemctl enable --now rkube-$role; follow it: journalctl -u rkube-$role -f"
done
