#!/usr/bin/env bash
# For a disposable CI machine: makes sure a user with /etc/subuid and
# /etc/subgid ranges exists, so that containers.podman.rootless runs rootless
# podman instead of skipping (issue 23). Does nothing when such a user
# exists already, or when not run as root. Not part of scripts/test.sh: on a
# developer's machine, adding a user is the owner's decision
# (docs/CONTAINERS.md says how).
#
#   scripts/rootless-user.sh [USER]     (default: svrootless)
set -euo pipefail
user=${1:-svrootless}
if [ "$(id -u)" != 0 ]; then
  echo "rootless-user: not root; no user added" >&2
  exit 0
fi
if [ -s /etc/subuid ] && [ -s /etc/subgid ]; then
  existing=$(awk -F: 'NR == 1 {print $1}' /etc/subuid)
  if id "$existing" >/dev/null 2>&1; then
    echo "rootless-user: $existing has subordinate ids already"
    exit 0
  fi
fi
touch /etc/subuid /etc/subgid
id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
# Debian's useradd gives a new user 65,536 subordinate ids when /etc/subuid
# exists (login.defs SUB_UID_*); otherwise add them here.
grep -q "^$user:" /etc/subuid 2>/dev/null || usermod --add-subuids 100000-165535 "$user"
grep -q "^$user:" /etc/subgid 2>/dev/null || usermod --add-subgids 100000-165535 "$user"
echo "rootless-user: $user: subuid $(grep "^$user:" /etc/subuid | cut -d: -f2-), subgid $(grep "^$user:" /etc/subgid | cut -d: -f2-)"
