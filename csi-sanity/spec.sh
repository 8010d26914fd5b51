#!/usr/bin/env bash
# Prints the CSI spec version (1.12 or 1.10) whose capabilities csi-relay
# must advertise to the csi-sanity binary given as $1, or says why it
# cannot tell and exits 2.
#
# What decides it is the suite compiled into the binary, not its version
# string: kubernetes-csi's release tooling sets main.version while
# csi-sanity prints main.VERSION, so a release build says "(dev)". A
# suite whose capability check knows GET_SNAPSHOT also carries the
# "GetSnapshot [Controller Server]" specs (both came in one change after
# v5.4.0); one built on spec v1.12 without them (v5.4.0) fails on that
# capability, and one built on v1.10 knows neither. A version string,
# when the binary has one, must agree with what the suite says.
set -euo pipefail

sanity=${1:?usage: spec.sh CSI_SANITY_BINARY}
if [ ! -f "$sanity" ] || [ ! -x "$sanity" ]; then
  echo "cannot tell the CSI spec: $sanity is not an executable file" >&2
  exit 2
fi

has() { grep -aqF -- "$1" "$sanity"; }

# Every csi-sanity of v3 or later has its controller specs under this name:
# a binary without it is not a csi-sanity whose suite this script can read.
if ! has "Controller Service [Controller Server]"; then
  echo "cannot tell the CSI spec: $sanity holds no csi-sanity suite ('Controller Service [Controller Server]' not found)" >&2
  exit 2
fi
if has "GetSnapshot [Controller Server]"; then
  spec=1.12
  why="its suite has the GetSnapshot specs"
elif has "GET_SNAPSHOT"; then
  spec=1.10
  why="built on CSI spec v1.12, but its capability check predates GET_SNAPSHOT (v5.4.0 and earlier)"
else
  spec=1.10
  why="built on CSI spec v1.10 or earlier"
fi

# "Version = v5.4.0", "Version = v5.4.0-12-gabc" (past the tag) or "(dev)".
printed=$("$sanity" --version 2>/dev/null | head -n 1 || true)
read -r major minor past < <(printf '%s\n' "$printed" |
  sed -n 's/.*v\([0-9]*\)\.\([0-9]*\)\.[0-9]*\(-[0-9]*-g\)\{0,1\}.*/\1 \2 \3/p') || true
if [ -n "${major:-}" ]; then
  old=0
  { [ "$major" -lt 5 ] || { [ "$major" -eq 5 ] && [ "$minor" -le 4 ]; }; } && old=1
  # A tagged v5.4 or earlier cannot have the GetSnapshot specs; a build past
  # v5.4 may or may not, so only its suite decides.
  if [ "$old" = 1 ] && [ -z "${past:-}" ] && [ "$spec" = 1.12 ]; then
    echo "cannot tell the CSI spec: $sanity prints '$printed' (v5.4 or older) but its suite has the GetSnapshot specs that came after v5.4.0" >&2
    exit 2
  fi
  if [ "$old" = 0 ] && [ "$spec" = 1.10 ] && has "GET_SNAPSHOT"; then
    echo "cannot tell the CSI spec: $sanity prints '$printed' (after v5.4) but its suite lacks the GetSnapshot specs every release after v5.4.0 has" >&2
    exit 2
  fi
fi
echo "csi-sanity $sanity (${printed:-no version printed}): CSI spec $spec, $why" >&2
echo "$spec"
