# checks.inc.sh: what the scripts that check a running env (restarts.sh,
# node-partition.sh) share: one "ok"/"FAIL" line per check, counted in
# $fails, timed from when this is sourced. Sourced after NS is set.
fails=0
T0=$(date +%s.%N)
at() { awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{printf "%6.1fs", a-b}'; }
ok() { echo "[$(at)] ok   $*"; }
fail() { echo "[$(at)] FAIL $*"; fails=$((fails + 1)); }
check() { # check WHAT CMD... : ok/FAIL by the command's status
  local what=$1; shift
  if "$@" > /dev/null 2>&1; then ok "$what"; else fail "$what"; fi
}
waitfor() { # waitfor SECONDS CMD... : 0 once CMD succeeds
  local t=$1 i; shift
  for ((i = 0; i < t * 5; i++)); do "$@" > /dev/null 2>&1 && return 0; sleep 0.2; done
  return 1
}
kn() { kh -n "$NS" "$@"; }
running() { [[ $(kn get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null) == Running ]]; }
