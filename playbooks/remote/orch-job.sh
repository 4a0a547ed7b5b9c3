#!/bin/sh
# orch-job: run one command of a job detached from the SSH session, on hosts without Docker.
#
#   orch-job.sh start  DIR CMD [ARG...]  start CMD in its own session (setsid nohup); returns
#                                        once DIR/pid exists; refuses while DIR holds a run
#   orch-job.sh status DIR               prints one line: running | exited CODE | lost | missing
#   orch-job.sh poll   DIR N             the status line, then the last N lines of DIR/log
#   orch-job.sh clear  DIR               forget the finished run in DIR (the log is kept),
#                                        ending what it left running, as `stop` does
#   orch-job.sh stop   DIR               end a run: SIGTERM to every process of its session,
#                                        SIGKILL to those left after 10 s; returns once none
#                                        is left (exit 1, run kept, if one outlives SIGKILL
#                                        by 10 s), then forgets it
#   orch-job.sh run    DIR CMD [ARG...]  (internal) the detached part: pid, log, exit code
#
# DIR holds `pid` ("PID STARTTIME BOOT_ID/pid:[NAMESPACE]"), `log` (stdout and stderr,
# appended) and `exit_code` (written when CMD ends). `lost` = the process is gone without an
# exit code: killed, or the host rebooted. Every value arrives as a positional parameter and
# is only ever expanded in double quotes: nothing the caller passes is evaluated by this
# shell.
set -u
set -f

# The kernel's start time of pid $1 (field 22 of /proc/PID/stat): a pid reused after a reboot
# or a wrap-around has another one, so `kill -0` alone cannot be trusted. Prints nothing for
# a zombie (an init that does not reap keeps it, and `kill -0` still succeeds on it).
starttime() {
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    rest=${stat##*) }
    # shellcheck disable=SC2086  # fields are numbers and one state letter; globbing is off
    set -- $rest
    case $1 in Z | X) return 1 ;; esac
    shift 19
    printf '%s\n' "$1"
}

alive() {  # whether the run recorded in $1/pid is still running
    [ -f "$1/pid" ] || return 1
    read -r pid started _ < "$1/pid" || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    [ "$started" = 0 ] && return 0
    [ "$(starttime "$pid")" = "$started" ]
}

# The running (not zombie) processes of the session whose leader was pid $1, on one line.
# `start` made the run a session leader, and everything it starts stays in that session
# unless it calls setsid itself. Its leader is a `sh` that dies at once on SIGTERM, while its
# children (a trainer, vLLM's engine process) may take seconds to exit or ignore the signal,
# and they hold the GPU's memory until they are gone: waiting on the leader is not enough.
members() {
    session=$1
    set +f
    found=
    for d in /proc/[0-9]*; do
        # `read`, a builtin: no process per entry. A process may end between glob and read.
        # Its name (in parentheses) may hold newlines and ") ": the lines are joined and
        # the fields are what follows the last ") ".
        stat=
        while IFS= read -r line; do stat="$stat$line "; done 2>/dev/null < "$d/stat" \
            || [ -n "$stat" ] || continue
        rest=${stat##*) }
        set -f
        # shellcheck disable=SC2086  # state letter and numbers only; globbing is off
        set -- $rest
        set +f
        # $1 state, $2 ppid, $3 process group, $4 session
        if [ $# -lt 4 ] || [ "$4" != "$session" ]; then continue; fi
        case $1 in Z | X) continue ;; esac
        found="$found ${d#/proc/}"
    done
    set -f
    printf '%s\n' "$found"
}

# Centiseconds since boot (/proc/uptime, read by a builtin: dash has no $SECONDS).
uptime_cs() {
    read -r up _ < /proc/uptime
    printf '%s\n' "${up%.*}${up#*.}"
}

# Sends signal $1 to the processes in $left, then waits up to 10 s until session $2 has none
# (leaves what is still there in $left; 1 when /proc cannot be read). SIGKILL goes again to
# what is left, for a child forked just before it; SIGTERM goes once, as a second one may cut
# short a clean shutdown.
signal_until_gone() {
    # shellcheck disable=SC2086  # a list of pids
    kill "-$1" $left 2>/dev/null
    # By the clock, not by a count of rounds: each round's /proc scan takes time too.
    deadline=$(($(uptime_cs) + 1000))
    while [ -n "${left# }" ] && [ "$(uptime_cs)" -lt "$deadline" ]; do
        sleep 0.1
        left=$(members "$2") || return 1
        # shellcheck disable=SC2086
        [ "$1" = KILL ] && [ -n "${left# }" ] && kill -KILL $left 2>/dev/null
    done
    return 0
}

# This boot and PID namespace ("BOOT_ID/pid:[INODE]"): a run recorded under another (the host
# rebooted, the container restarted with its disk kept) has no process left, and the pid it
# recorded may be anyone's session now.
where() {
    read -r boot 2>/dev/null < /proc/sys/kernel/random/boot_id || boot=
    printf '%s/%s\n' "$boot" "$(readlink /proc/self/ns/pid)"
}

status() {
    if [ -f "$1/exit_code" ]; then
        printf 'exited %s\n' "$(cat "$1/exit_code")"
    elif alive "$1"; then
        echo running
    elif [ -f "$1/exit_code" ]; then  # it finished between the two tests
        printf 'exited %s\n' "$(cat "$1/exit_code")"
    elif [ -f "$1/pid" ]; then
        echo lost
    else
        echo missing
    fi
}

# Ends what is left of the run in $1: SIGTERM to every process of its session, SIGKILL to
# those left after 10 s; returns once none is left (1, with a message, if one outlives
# SIGKILL by 10 s, or /proc cannot be read: never "none left" for want of looking).
end_session() {
    [ -f "$1/pid" ] && read -r sid started recorded < "$1/pid" || return 0
    # Recorded in another boot or container (a run from before this file had the field
    # counts as this one's): nothing of it runs here.
    [ -z "${recorded:-}" ] || [ "$recorded" = "$(where)" ] || return 0
    # A leader pid that now names another process (its start time differs) is not this
    # run's: then nothing here is signalled.
    leader=$(starttime "$sid") || leader=
    [ -z "$leader" ] || [ "$started" = 0 ] || [ "$leader" = "$started" ] || return 0
    if ! left=$(members "$sid") \
            || { [ -n "${left# }" ] && ! signal_until_gone TERM "$sid"; } \
            || { [ -n "${left# }" ] && ! signal_until_gone KILL "$sid"; }; then
        echo "orch-job.sh: cannot read /proc to find the processes of the run in $1" >&2
        return 1
    fi
    if [ -n "${left# }" ]; then
        echo "orch-job.sh: processes$left of the run in $1 are still there 10 s after SIGKILL (stuck in the kernel, or the GPU driver); the run is kept" >&2
        return 1
    fi
}

mode=${1:-}
[ $# -ge 2 ] || { echo "usage: orch-job.sh start|status|poll|clear|stop|run DIR ..." >&2; exit 2; }
shift
dir=$1
shift

case $mode in
start)
    [ $# -ge 1 ] || { echo "orch-job.sh start: no command" >&2; exit 2; }
    mkdir -p "$dir" || exit 1
    if [ -f "$dir/pid" ] || [ -f "$dir/exit_code" ]; then
        echo "orch-job.sh: $dir already holds a run ($(status "$dir")); clear it first" >&2
        exit 3
    fi
    setsid nohup sh "$0" run "$dir" "$@" >/dev/null 2>&1 </dev/null &
    i=0
    while [ ! -s "$dir/pid" ]; do
        i=$((i + 1))
        if [ "$i" -gt 200 ]; then
            echo "orch-job.sh: the job did not start within 10 s" >&2
            exit 1
        fi
        sleep 0.05
    done
    ;;
run)
    st=$(starttime $$) || st=0
    printf '%s %s %s\n' "$$" "$st" "$(where)" > "$dir/pid.tmp" && mv -f "$dir/pid.tmp" "$dir/pid"
    "$@" >>"$dir/log" 2>&1 </dev/null
    code=$?
    # Written aside and renamed, so a reader never sees an empty exit code.
    printf '%s\n' "$code" > "$dir/exit_code.tmp" && mv -f "$dir/exit_code.tmp" "$dir/exit_code"
    exit "$code"
    ;;
status)
    status "$dir"
    ;;
poll)
    status "$dir"
    if [ -f "$dir/log" ]; then tail -n "${1:-50}" "$dir/log"; fi
    ;;
clear)
    if [ ! -f "$dir/exit_code" ] && alive "$dir"; then
        echo "orch-job.sh: the run in $dir is still running" >&2
        exit 3
    fi
    # What the run started and left behind (a trainer's worker when its launcher exited, a
    # run whose leader was killed alone) is ended too, as Docker ends a container's
    # processes when it exits: they would hold the GPU's memory from the next run.
    end_session "$dir" || exit 1
    rm -f "$dir/pid" "$dir/exit_code"
    ;;
stop)
    end_session "$dir" || exit 1
    rm -f "$dir/pid" "$dir/exit_code"
    ;;
*)
    echo "orch-job.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
