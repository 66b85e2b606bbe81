#!/usr/bin/env bash
# The HA lab's Debian packages (docs/scaling.md, `make lab-test`), installed when missing, as root.
# The lab runs these programs itself, in its namespaces under its own supervisord: the packages' own
# services must not run. A policy-rc.d that exits 101 keeps their maintainer scripts from starting
# them (removed afterwards only if this script made it); whatever started nevertheless is stopped
# and its service disabled. Patroni is not among them: the lab installs its pinned Patroni from
# PyPI in a virtualenv of its own (exchange/stack/lab/cluster.py, ensure_patroni).
set -euo pipefail

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# package -> the service its maintainer scripts would start ("" for none)
declare -A SERVICE=(
  [etcd-server]=etcd
  [redis-server]=redis-server
  [redis-sentinel]=redis-sentinel
  [haproxy]=haproxy
  [postgresql-15]=""
  [nginx-light]=nginx
  [python3-venv]=""
  [iproute2]=""
)
DAEMONS='etcd|redis-server|redis-sentinel|haproxy|nginx'
# Their pids (not `pgrep -x` with the alternation: pgrep matches nothing past 15 characters of pattern).
daemons() { ps -eo pid=,comm= | awk -v names="^($DAEMONS)\$" '$2 ~ names {print $1}' | sort; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for package in "${!SERVICE[@]}"; do
  # nginx: any of Debian's nginx packages will do (make test's services install nginx-light)
  if [ "$package" = nginx-light ] && { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }; then
    continue
  fi
  installed "$package" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "lab packages: all installed" >&2
  exit 0
fi

echo "lab packages: installing ${missing[*]}" >&2
before=$(daemons)
added_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
  as_root chmod 755 /usr/sbin/policy-rc.d
  added_policy=1
fi
status=0
as_root apt-get update -qq || status=$?
if [ $status -eq 0 ]; then
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || status=$?
fi
[ -z "$added_policy" ] || as_root rm -f /usr/sbin/policy-rc.d
[ $status -eq 0 ] || exit $status

# Only the services of the packages just installed: a machine's own Redis or nginx stays as it was.
for package in "${missing[@]}"; do
  service=${SERVICE[$package]}
  [ -n "$service" ] || continue
  if [ -d /run/systemd/system ]; then
    as_root systemctl disable --now "$service" >/dev/null 2>&1 || true
  elif [ -x "/etc/init.d/$service" ]; then
    as_root update-rc.d "$service" disable >/dev/null 2>&1 || true
  fi
done
after=$(daemons)
started=$(comm -13 <(echo "$before") <(echo "$after") | grep . || true)
for pid in $started; do
  echo "lab packages: stopping $(ps -o comm= -p "$pid" || true) ($pid), started by the install" >&2
  as_root kill "$pid" 2>/dev/null || true
done
