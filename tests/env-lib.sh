# env-lib.sh: what the project's environment scripts (tests/*/env-up.sh)
# share. Sourced; starts the clock ts() measures from.
T0=$(date +%s.%N)
ts() { printf '[%6.2fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{print a-b}')" "$*"; }
waitfor() { # waitfor SECONDS WHAT CMD... : polls CMD every 0.2 s
  local t=$1 what=$2 i; shift 2
  for ((i = 0; i < t * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out after ${t}s waiting for: $what" >&2; return 1
}
