# shellcheck shell=bash
# Helpers shared by env-up.sh / env-down.sh; tests may source it to register their own processes
# (e.g. the multi-cluster CSI driver under test) so env-down.sh stops them too.
#
# Tracking format, per process NAME in $E2E_PIDS_DIR:
#   NAME.pid    the PID (single line; `kill $(cat NAME.pid)` works)
#   NAME.exe    absolute, symlink-resolved path of the binary it must be running
#   NAME.start  /proc/PID/stat starttime (clock ticks) - guards against PID reuse
E2E=${E2E_HOME:?set E2E_HOME}/run/env   # the environment's own state (env.sh, pids, logs, sockets)
E2E_PIDS_DIR=$E2E/pids
E2E_LOG_DIR=$E2E/logs

e2e_starttime() { # e2e_starttime PID -> field 22 of /proc/PID/stat
  local s
  s=$(cat /proc/$1/stat 2>/dev/null) || return 1
  s=${s##*) }          # drop "pid (comm) " (comm may contain spaces)
  set -- $s            # now $1=state(field 3) ... field 22 = ${20}
  echo "${20}"
}

e2e_alive() { # e2e_alive NAME : 0 if NAME.pid is running NAME.exe (and start time matches)
  local n=$1 pid exe st
  [[ -s $E2E_PIDS_DIR/$n.pid ]] || return 1
  pid=$(cat "$E2E_PIDS_DIR/$n.pid"); [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
  exe=$(cat "$E2E_PIDS_DIR/$n.exe" 2>/dev/null) || return 1
  [[ -n $exe && "$(readlink /proc/$pid/exe 2>/dev/null)" == "$exe"* ]] || return 1
  if [[ -s $E2E_PIDS_DIR/$n.start ]]; then
    [[ "$(e2e_starttime "$pid")" == "$(cat "$E2E_PIDS_DIR/$n.start")" ]] || return 1
  fi
}

e2e_track() { # e2e_track NAME PID : register an already-started process
  local n=$1 pid=$2 exe
  exe=$(readlink /proc/$pid/exe) || { echo "e2e_track: pid $pid not running" >&2; return 1; }
  mkdir -p "$E2E_PIDS_DIR"
  echo "$pid" >"$E2E_PIDS_DIR/$n.pid"
  echo "$exe" >"$E2E_PIDS_DIR/$n.exe"
  e2e_starttime "$pid" >"$E2E_PIDS_DIR/$n.start"
}

e2e_start() { # e2e_start NAME BINARY ARGS... : setsid'ed, log in $E2E_LOG_DIR/NAME.log, tracked
  local n=$1 bin; shift
  bin=$(readlink -f "$1") || return 1; shift
  [[ -x $bin ]] || { echo "e2e_start: $bin not executable" >&2; return 1; }
  if e2e_alive "$n"; then echo "e2e_start: $n already running (pid $(cat "$E2E_PIDS_DIR/$n.pid"))" >&2; return 1; fi
  mkdir -p "$E2E_PIDS_DIR" "$E2E_LOG_DIR"
  echo "=== $(date -u +%FT%TZ) e2e_start $n: $bin $*" >>"$E2E_LOG_DIR/$n.log"
  # without job control the background child is not a group leader, so setsid(1) does not fork
  # and $! is the binary's own PID (same trick as cluster-up.sh)
  local had_m=0; [[ $- == *m* ]] && had_m=1 && set +m
  setsid "$bin" "$@" >>"$E2E_LOG_DIR/$n.log" 2>&1 </dev/null &
  local pid=$!
  ((had_m)) && set -m
  echo "$pid" >"$E2E_PIDS_DIR/$n.pid"
  echo "$bin" >"$E2E_PIDS_DIR/$n.exe"
  # the exec may not have happened yet; wait until /proc/PID/exe is the binary, then record start time
  local i
  for ((i = 0; i < 50; i++)); do
    [[ "$(readlink /proc/$pid/exe 2>/dev/null)" == "$bin"* ]] && break
    [[ -d /proc/$pid ]] || break
    sleep 0.1
  done
  e2e_starttime "$pid" >"$E2E_PIDS_DIR/$n.start" 2>/dev/null || true
  e2e_alive "$n" || { echo "e2e_start: $n (pid $pid) died at once; see $E2E_LOG_DIR/$n.log" >&2; tail -5 "$E2E_LOG_DIR/$n.log" >&2; return 1; }
}

e2e_gone() { # e2e_gone PID : 0 if the process no longer exists or is a zombie (this VM's PID 1 reaps slowly, ~2s)
  local st
  st=$(cat /proc/$1/stat 2>/dev/null) || return 0
  st=${st##*) }; [[ ${st:0:1} == Z ]]
}

e2e_stop() { # e2e_stop NAME... : SIGTERM all (only if the PID still runs the recorded binary), wait <=15s, then SIGKILL
  local n pid i todo=() pids=()
  for n in "$@"; do
    pid=$(cat "$E2E_PIDS_DIR/$n.pid" 2>/dev/null || echo "?")
    if e2e_alive "$n"; then
      kill -TERM "$pid" 2>/dev/null || true; todo+=("$n"); pids+=("$pid")
    else
      echo "$n (pid $pid) not running (or pid reused); not touched"
      rm -f "$E2E_PIDS_DIR/$n.pid" "$E2E_PIDS_DIR/$n.exe" "$E2E_PIDS_DIR/$n.start"
    fi
  done
  for ((i = 0; i < 150; i++)); do
    local busy=0 p
    for p in "${pids[@]}"; do e2e_gone "$p" || busy=1; done
    ((busy)) || break
    sleep 0.1
  done
  for i in "${!todo[@]}"; do
    n=${todo[$i]} pid=${pids[$i]}
    if ! e2e_gone "$pid" && e2e_alive "$n"; then kill -KILL "$pid" 2>/dev/null || true; echo "killed $n (pid $pid) with SIGKILL after 15s"
    else echo "stopped $n (pid $pid)"; fi
    rm -f "$E2E_PIDS_DIR/$n.pid" "$E2E_PIDS_DIR/$n.exe" "$E2E_PIDS_DIR/$n.start"
  done
}

e2e_mounts_under() { # e2e_mounts_under DIR : mount points at/below DIR, deepest first
  findmnt -rn -o TARGET 2>/dev/null | awk -v d="$1" '$0 == d || index($0, d "/") == 1' | awk '{ print length, $0 }' | sort -rn | cut -d' ' -f2-
}

e2e_loops_under() { # e2e_loops_under DIR : loop devices whose backing file is below DIR
  losetup -n -l -O NAME,BACK-FILE 2>/dev/null | awk -v d="$1/" 'index($2, d) == 1 { print $1 }'
}
