#!/usr/bin/env bash
# Make sure a Debian package that a make target needs is installed: install it when this user may
# (root, or sudo without a password), else stop with ONE line giving the exact command to run.
#
#   tools/ensure_system_deps.sh [--optional] CHECK_PATH PACKAGE [WHAT [ELSEWHERE]]
#
# ELSEWHERE: what to do off Debian/Ubuntu (no apt-get), said instead of an apt line nobody can run there.
# CHECK_PATH present: nothing to do. --optional: when it cannot be installed, say so in one line and
# exit 0 (the tests that need it skip). Environment, for tests: FEDENT_APT_GET (default apt-get),
# FEDENT_SUDO (default sudo), FEDENT_EUID (default the real effective uid).
set -u
optional=0
if [ "${1:-}" = "--optional" ]; then optional=1; shift; fi
check=${1:?check path}; pkg=${2:?package}; what=${3:-$pkg}; elsewhere=${4:-}
[ -e "$check" ] && exit 0
apt=${FEDENT_APT_GET:-apt-get}
sudo_cmd=${FEDENT_SUDO:-sudo}
euid=${FEDENT_EUID:-$(id -u)}
if [ "$euid" = 0 ]; then
  run=()
elif command -v "$sudo_cmd" >/dev/null 2>&1 && "$sudo_cmd" -n true >/dev/null 2>&1; then
  run=("$sudo_cmd" -n)
else
  run=(none)
fi
if [ "${run[0]:-}" != none ] && command -v "$apt" >/dev/null 2>&1; then
  echo "installing $pkg ($what is missing: $check)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if "${run[@]}" "$apt" install -y -q "$pkg" >/dev/null || { "${run[@]}" "$apt" update -q >/dev/null &&
     "${run[@]}" "$apt" install -y -q "$pkg" >/dev/null; }; then
    [ -e "$check" ] && exit 0
  fi
fi
if ! command -v "$apt" >/dev/null 2>&1 && [ -n "$elsewhere" ]; then
  if [ "$optional" = 1 ]; then
    echo "note: $what not installed (its tests skip); not a Debian/Ubuntu system (no $apt): $elsewhere" >&2
    exit 0
  fi
  echo "missing $what ($check); not a Debian/Ubuntu system (no $apt): $elsewhere" >&2
  exit 1
fi
if [ "$optional" = 1 ]; then
  echo "note: $what not installed (its tests skip); to add it: sudo apt-get install -y $pkg" >&2
  exit 0
fi
echo "missing $what ($check); install it with: sudo apt-get install -y $pkg" >&2
exit 1
