#!/usr/bin/env bash
# Install the Debian packages of the given lists (scripts/packages/*.txt) that are missing, as root:
# `make test` installs test.txt (scripts/services.sh), `make lab-test` test.txt and lab.txt
# (scripts/lab-packages.sh). `apt-get update` first. A policy-rc.d that exits 101 keeps the packages'
# maintainer scripts from starting their services (removed afterwards only if this script made it):
# the tests and the lab start the programs themselves. The services a list names for the packages
# just installed are disabled, and a daemon of theirs that started nevertheless is stopped.
# Prints only to stderr. Idempotent: nothing is done when every package is installed.
set -euo pipefail

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

declare -A SERVICE=()
order=()
for list in "$@"; do
  while read -r package service _; do
    [ -n "$package" ] || continue
    [ -n "${SERVICE[$package]+x}" ] || order+=("$package")
    SERVICE[$package]=${service:-}
  done < <(sed -e 's/#.*//' "$list")
done

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

missing=()
for package in "${order[@]}"; do
  # nginx: any of Debian's nginx packages will do (nginx-light is the smallest)
  if [ "$package" = nginx-light ] && { command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; }; then
    continue
  fi
  installed "$package" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "packages: all installed ($*)" >&2
  exit 0
fi

# The services' daemons (not `pgrep -x` with an alternation: pgrep matches nothing past 15 characters
# of pattern).
names=$(for package in "${missing[@]}"; do [ -z "${SERVICE[$package]}" ] || echo "${SERVICE[$package]}"; done | paste -sd'|')
daemons() { [ -z "$names" ] || ps -eo pid=,comm= | awk -v names="^($names)\$" '$2 ~ names {print $1}' | sort; }

echo "packages: installing ${missing[*]}" >&2
before=$(daemons)
added_policy=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
  as_root chmod 755 /usr/sbin/policy-rc.d
  added_policy=1
fi
status=0
as_root apt-get update -qq >&2 || status=$?
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
  echo "packages: stopping $(ps -o comm= -p "$pid" || true) ($pid), started by the install" >&2
  as_root kill "$pid" 2>/dev/null || true
done
echo "packages: installed ${missing[*]}" >&2
