# processes.inc.sh: what a pod's restart policy does, for the processes
# env-up.sh starts bare (recorded in $LAB/pids by kl_start; needs kl-lib.sh).
# Sourced by restarts.sh and group-snapshots.sh.
saved_argv=() saved_env=()
save() { # save NAME : remember NAME's command line and environment
  local pid; pid=$(cat "$LAB/pids/$1.pid")
  saved_argv[$2]=$(tr '\0' '\n' < "/proc/$pid/cmdline")
  saved_env[$2]=$(tr '\0' '\n' < "/proc/$pid/environ")
}
start_saved() { # start_saved NAME SLOT LOGFILE : start NAME again as saved in SLOT
  local n=$1 pid argv envv
  mapfile -t argv <<< "${saved_argv[$2]}"
  mapfile -t envv <<< "${saved_env[$2]}"
  rm -f "$LAB/pids/$n".{pid,exe,start}
  kl_start "$n" "$3" /usr/bin/env -i "${envv[@]}" "${argv[@]}"
  # kl_start may have recorded env itself, before it became the program.
  pid=$(cat "$LAB/pids/$n.pid")
  for ((i = 0; i < 50; i++)); do
    [[ $(readlink -f "/proc/$pid/exe") == "$(readlink -f "${argv[0]}")" ]] && break; sleep 0.1
  done
  kl_track "$n" "$pid"
}
kill_hard() { # kill_hard NAME : SIGKILL, and wait until it is gone
  local pid; pid=$(cat "$LAB/pids/$1.pid")
  kill -KILL "$pid"
  for ((i = 0; i < 50; i++)); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
}
