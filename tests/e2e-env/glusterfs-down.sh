#!/usr/bin/env bash
# glusterfs-down.sh DIR: undoes glusterfs-up.sh DIR (also a partial one, and
# twice): the clients first, each stopped by its recorded PID (SIGTERM
# unmounts), a mount left behind (its client gone: "Transport endpoint is not
# connected") unmounted with umount; then the brick (recorded PID, or the
# pidfile glusterd wrote under DIR/run when the run failed before recording
# it) and glusterd by PID; then what gluster created under /var/lib/glusterd,
# /var/run/gluster and /var/log/glusterfs that DIR/state/var-before does not
# list (nothing without that list). Deletes the volume's data (DIR/brick) and
# state; keeps DIR/logs. Refuses to delete anything while a mount remains.
# Exit 1 if something could not be cleaned.
set -uo pipefail
DIR=${1:?usage: glusterfs-down.sh DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -d $DIR ]] || exit 0
DIR=$(cd "$DIR" && pwd)
LAB=$DIR
source "$HERE/kubelet/kl-lib.sh"
rc=0
VAR_DIRS=(/var/lib/glusterd /var/run/gluster /var/log/glusterfs)
MOUNTS=()
[[ -s $DIR/state/mounts ]] && mapfile -t MOUNTS < "$DIR/state/mounts"

gone() { # gone PID : no such process, or a zombie (this machine's PID 1 reaps slowly, ~2 s)
  local st; st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  st=${st##*) }; [[ ${st:0:1} == Z ]]
}
stop() { # stop GRACE NAME... : SIGTERM to every recorded process still running its binary, then wait; SIGKILL after GRACE s
  local grace=$1 n i busy pids=() names=(); shift
  for n in "$@"; do
    if kl_alive "$n"; then pids+=("$(cat "$LAB/pids/$n.pid")"); names+=("$n"); kill -TERM "${pids[-1]}" 2>/dev/null
    elif [[ -s $LAB/pids/$n.pid ]]; then kl_log "$n (pid $(cat "$LAB/pids/$n.pid")) not running (or pid reused); not touched"; fi
  done
  for ((i = 0; i < grace * 10; i++)); do
    busy=0; for n in "${pids[@]}"; do gone "$n" || busy=1; done
    ((busy)) || break; sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if gone "${pids[$i]}"; then kl_log "stopped ${names[$i]} (pid ${pids[$i]})"
    else kill -KILL "${pids[$i]}" 2>/dev/null; kl_log "killed ${names[$i]} (pid ${pids[$i]}) with SIGKILL after ${grace}s"; fi
  done
  for n in "$@"; do rm -f "$LAB/pids/$n".{pid,exe,start}; done
}

# ---- 1. the clients, together (SIGTERM: a client unmounts and exits)
clients=()
for f in "$DIR"/pids/client-*.pid; do [[ -e $f ]] && clients+=("$(basename "$f" .pid)"); done
((${#clients[@]})) && stop 10 "${clients[@]}"
gmounted() { [[ "$(findmnt -n -o FSTYPE --mountpoint "$1" 2>/dev/null | tail -1)" == fuse.glusterfs ]]; }
for m in "${MOUNTS[@]}"; do
  for attempt in 1 2 3; do
    gmounted "$m" || break
    if ((attempt < 3)); then umount "$m" 2>/dev/null && kl_log "unmounted $m (its client was gone)"
    else umount -l "$m" && kl_log "lazily unmounted $m"; fi
    gmounted "$m" && sleep 1
  done
  gmounted "$m" && { echo "still mounted: $m" >&2; rc=1; }
done

# ---- 2. the brick, 3. glusterd (recorded PIDs; else the pidfiles glusterd and its bricks wrote in DIR/run)
stop_pidfile() { # stop_pidfile FILE WHAT : SIGTERM the PID in FILE if it runs glusterfsd with FILE on its command line
  local f=$1 p i
  [[ -s $f ]] || return 0
  p=$(cat "$f"); [[ $p =~ ^[0-9]+$ ]] || return 0
  [[ "$(readlink -f /proc/"$p"/exe 2>/dev/null)" == */glusterfsd ]] || return 0
  tr '\0' '\n' < /proc/"$p"/cmdline 2>/dev/null | grep -qxF "$f" || return 0
  kill -TERM "$p" 2>/dev/null
  for ((i = 0; i < 150; i++)); do gone "$p" && break; sleep 0.1; done
  gone "$p" || kill -KILL "$p"
  kl_log "stopped $2 (pid $p, from $f)"
}
stop 15 brick
for f in "$DIR"/run/vols/*/*.pid; do [[ -e $f ]] && stop_pidfile "$f" "brick"; done
stop 15 glusterd
stop_pidfile "$DIR/run/glusterd.pid" glusterd
for f in "$DIR"/pids/*.pid; do [[ -e $f ]] && stop 10 "$(basename "$f" .pid)"; done
# Gluster programs still running on DIR (a gluster CLI call of an interrupted
# glusterfs-up.sh, and what it runs: `gsyncd`, which writes under
# /var/lib/glusterd) are waited for, never killed by a guess; if they stay,
# nothing is cleaned (run again).
on_dir() { # PIDs of gluster programs whose command line names DIR, and of their children
  local p s ours=()
  for p in /proc/[0-9]*; do
    [[ "$(readlink -f "$p/exe" 2>/dev/null)" == */gluster* ]] || continue
    tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$DIR/" && ours+=("${p#/proc/}")
  done
  ((${#ours[@]})) || return 0
  printf '%s\n' "${ours[@]}"
  for p in /proc/[0-9]*; do
    s=$(cat "$p/stat" 2>/dev/null) || continue; s=${s##*) }; s=${s#* }
    [[ " ${ours[*]} " == *" ${s%% *} "* ]] && echo "${p#/proc/}"
  done
}
running_on_dir() { local p; for p in $(on_dir); do gone "$p" || return 0; done; return 1; }
for ((i = 0; i < 150; i++)); do running_on_dir || break; sleep 0.1; done
if running_on_dir; then
  echo "gluster processes on $DIR still running: $(for p in $(on_dir); do gone "$p" || printf '%s ' "$p"; done); not cleaning (run again)" >&2
  exit 1
fi

# ---- 4. what gluster wrote under /var although told otherwise: only paths the record before the run lacks
if [[ -s $DIR/state/var-before ]]; then
  n=0
  while IFS= read -r p; do
    case $p in /var/lib/glusterd/* | /var/run/gluster/* | /var/log/glusterfs/* | /var/lib/glusterd | /var/run/gluster | /var/log/glusterfs) ;; *) continue ;; esac
    if [[ -d $p && ! -L $p ]]; then rmdir -- "$p" 2>/dev/null || { echo "not empty, kept: $p" >&2; rc=1; continue; }
    else rm -f -- "$p"; fi
    n=$((n + 1))
  done < <(LC_ALL=C comm -13 "$DIR/state/var-before" <(find "${VAR_DIRS[@]}" 2>/dev/null | LC_ALL=C sort) | LC_ALL=C sort -r)
  ((n)) && kl_log "removed $n path(s) gluster created under ${VAR_DIRS[*]}"
elif [[ -e $DIR/state ]]; then
  echo "no $DIR/state/var-before: leaving /var/lib/glusterd and /var/run/gluster as they are" >&2
fi

# ---- 5. state (nothing while a mount remains)
lm=$(kl_mounts_under "$DIR" "${MOUNTS[@]}")
if [[ -n $lm ]]; then echo "mounts remain; NOT deleting state: ${lm//$'\n'/ }" >&2; exit 1; fi
for m in "${MOUNTS[@]}"; do rmdir -- "$m" 2>/dev/null || true; done
rm -rf -- "$DIR"/{work,run,brick,pids,state,state.new} "$DIR/glusterd.vol"
kl_log "glusterfs down ($DIR cleaned; logs kept in $DIR/logs)"
exit $rc
