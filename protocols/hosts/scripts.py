"""The POSIX sh scripts a workspace runs on a machine (Linux and macOS: no GNU-only flags without a
fallback). Each is a function of quoted arguments, so what runs there can be read in one place."""

from __future__ import annotations

import re
import secrets
import shlex

q = shlex.quote

# exit codes of our scripts that mean a refusal (the same would happen again)
EXIT_GUARD = 4
EXIT_INPUT = 5

# Resolve a root given as ~/x on the host, create it private if missing, and refuse one that is not
# the login user's own private folder: everything we later trust there rests on no one else writing it.
ROOT = r"""r=$1
case "$r" in "~") r=$HOME;; "~/"*) r="$HOME/${r#\~/}";; esac
if [ ! -e "$r" ]; then (umask 077; mkdir -p "$r") || exit 3; fi
if [ -L "$r" ] || [ ! -d "$r" ]; then echo "root $r is not a folder (or is a link)" >&2; exit 4; fi
[ -O "$r" ] || { echo "root $r is not owned by $(id -un)" >&2; exit 4; }
case "$(ls -ld "$r" | cut -c6,9)" in *w*) echo "root $r is writable by group or others" >&2; exit 4;; esac
cd "$r" && pwd -P
"""

# Publish a folder in one step: rename $1 to $2 unless $2 exists (then $1 is dropped: the same
# content, by its hash, got there first). GNU mv -T, else perl's rename (BSD mv would nest).
PUBLISH = r"""publish() {
  mv -T "$1" "$2" 2>/dev/null || perl -e 'rename($ARGV[0], $ARGV[1]) or exit 1' "$1" "$2" 2>/dev/null || {
    chmod -R u+w "$1"; rm -rf "$1"; [ -e "$2/.complete" ]; }
}
"""

# openssl first: several times faster than coreutils' sha256sum on big inputs (it uses SHA-NI)
SHA256 = r"""sha() { (openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1" 2>/dev/null || shasum -a 256 "$1") | cut -d' ' -f1; }
"""


def have(folder: str, incoming: str) -> str:
    """'have' if `folder` is published; else an empty `incoming` is made for the upload and 'need'."""
    return (
        f"if [ -e {q(folder)}/.complete ]; then echo have; exit 0; fi\n"
        f"mkdir -p {q(folder.rsplit('/', 1)[0])} && rm -rf {q(incoming)} && echo need\n"
    )


def publish_code(incoming: str, folder: str) -> str:
    return PUBLISH + f"touch {q(incoming)}/.complete && chmod -R a-w {q(incoming)} && publish {q(incoming)} {q(folder)}\n"


def publish_input(incoming: str, folder: str, sha256: str, name: str, is_file: bool) -> str:
    verify = ""
    if is_file:
        verify = SHA256 + (
            f"got=$(sha {q(incoming)}/data)\n"
            f'if [ "$got" != {q(sha256)} ]; then rm -rf {q(incoming)}; '
            f'echo "input {name} arrived as sha256 $got, not {sha256}: it changed since it was read" >&2; exit {EXIT_INPUT}; fi\n'
        )
    return PUBLISH + verify + (
        f"touch {q(incoming)}/.complete && chmod -R a-w {q(incoming)} && publish {q(incoming)} {q(folder)}\n"
    )


def discard(path: str) -> str:
    return f"[ -e {q(path)} ] || exit 0; chmod -R u+w {q(path)} 2>/dev/null; rm -rf {q(path)}\n"


# How a pid is known to be our job's: its command line holds the attempt's tag (`$w/tag`, ASCII:
# ps may print a folder's newline or non-ASCII name as `?`), or, started before tags, the folder.
# Where /proc is (Linux), `running` reads the pid's state and command line there with the shell's
# own `read` (the NULs between arguments are dropped and a `sh -c` script's lines joined, so the
# tag is found as a substring, as in ps's output); elsewhere (macOS) it asks `ps`, which costs
# about 8 ms of CPU a call on Linux, and the poll, the stop and the watchdog each ask.
ALIVE = 'date +%s > "$w/alive.tmp" 2>/dev/null && mv -f "$w/alive.tmp" "$w/alive" 2>/dev/null\n'

TAG = 'tag=; { read -r tag < "$w/tag"; } 2>/dev/null || :; tag=${tag:-$w}\n'

RUNNING = TAG + r"""running_ps() { _r_s=$(ps -ww -p "$1" -o stat= -o command= 2>/dev/null) || return 1
  case "$_r_s" in Z*|"") return 1;; *"$tag"*) return 0;; esac; return 1; }
running() { [ -r /proc/self/stat ] || { running_ps "$1"; return; }
  _r_s=; { read -r _r_s < "/proc/$1/stat"; } 2>/dev/null || return 1
  case "${_r_s##*) }" in Z*|X*|"") return 1;; esac
  _r_s=; { while IFS= read -r _r_l || [ -n "$_r_l" ]; do _r_s="$_r_s$_r_l "; _r_l=; done < "/proc/$1/cmdline"; } 2>/dev/null
  case "$_r_s" in *"$tag"*) return 0;; esac; return 1; }
"""

# The attempt's processes, however they detached: every process of the user whose environment holds
# the attempt's mark (`ACTOR_RUN_TAG=<tag>`, put in the job's environment: every descendant inherits
# it through setsid, nohup and double forks), and, while its leader runs (`$1`, the session leader's
# pid: a session id is not reused while it names a live session), the members of the job's session
# that cleared their environment (not this shell's own children: the pipeline asking is in the session
# when the leader asks). Linux reads /proc (one grep over every environ, one cat of every
# stat); elsewhere (macOS) `ps -E` prints the environments of the user's own processes. A GPU
# process of the attempt is one of these (nvidia-smi's compute-apps list is checked the same way,
# where the tool exists). `reap` stops then kills them all, and again until no one is left (a
# process forking as it dies makes one more), never this shell itself; bounded, 20 rounds.
MEMBERS = r"""members() {
  if [ -r /proc/self/stat ]; then
    { grep -lszxF "ACTOR_RUN_TAG=$tag" /proc/[0-9]*/environ; [ $? -gt 1 ] && grep -lsaF "ACTOR_RUN_TAG=$tag" /proc/[0-9]*/environ
      if [ -n "$1" ]; then cat /proc/[0-9]*/stat 2>/dev/null |
        awk -v s="$1" -v me="$$" '{ p = $1; sub(/^.*\) /, ""); if ($4 == s && $1 != "Z" && $1 != "X") up[p] = $2 }
          END { for (p in up) { q = p; ours = 0; for (n = 0; n < 64 && (q in up); n++) { if (up[q] == me) { ours = 1; break }; q = up[q] }
                if (!ours) print "/proc/" p "/" } }'; fi
      if command -v nvidia-smi >/dev/null 2>&1; then
        for _g in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
          case "$_g" in ""|*[!0-9]*) continue;; esac
          grep -qszxF "ACTOR_RUN_TAG=$tag" "/proc/$_g/environ" && echo "/proc/$_g/"
        done
      fi
    } 2>/dev/null | sed -n 's|^/proc/\([0-9]*\)/.*|\1|p' | sort -u | grep -vx "$$"
  else
    ps -A -E -ww -o pid= -o command= 2>/dev/null | grep -F "ACTOR_RUN_TAG=$tag" | awk '{ print $1 }' | grep -vx "$$"
  fi
  return 0
}
reap() { _rp_n=0
  while [ $_rp_n -lt 20 ]; do
    _rp_m=$(members "$1"); [ -n "$_rp_m" ] || return 0
    kill -s STOP $_rp_m 2>/dev/null; kill -s KILL $_rp_m 2>/dev/null
    _rp_n=$((_rp_n + 1)); sleep 0.1
  done
  return 1
}
"""

# The host's backstop for a job its controller lost: every `every` seconds, if no controller wrote
# `alive` for `lost` seconds and the job still runs, stop its process group and remove the folder
# (its outputs are partial). A finished job keeps its folder `keep` seconds for a controller that
# comes back: its results are whole. What it removes leaves a tombstone beside it, `a<n>.lost`
# ("<last alive stamp> <lost_after>"): a sweep still reads there that the controller went silent
# (`beats`). Once the folder is gone (the controller tidied it, or somebody removed it under a job
# still running, whose outputs then have nowhere to go and whose heartbeat nobody can write), the
# job is killed if it still runs, and the watchdog ends: the folder is looked at every second, the
# heartbeat every `every`. A sandbox's delete by another process (a controller's resume) can race
# a start still in flight on the host (its controller was killed meanwhile): the start records the
# watchdog's pid after the delete has looked for the pids, and only the folder's absence ends that
# watchdog and its job (they lived up to `every`, 15-30 s, after the delete). Whatever ends the job
# here ends every process of the attempt (`reap`: its mark and its session), not only its group; a
# finished job whose controller is lost keeps its folder, not what it left running.
WATCHDOG = r"""w=$1 pid=$2 lost=$3 every=$4 keep=$5
""" + RUNNING + MEMBERS + r"""n=0
while :; do
  sleep 1
  if [ ! -d "$w" ]; then
    sid=; running "$pid" && sid=$pid && kill -s KILL -- "-$pid" 2>/dev/null  # no grace: nothing it writes has anywhere to go
    reap "$sid"
    exit 0
  fi
  n=$((n + 1)); [ "$n" -lt "$every" ] && continue; n=0
  last=; { read -r last < "$w/alive"; } 2>/dev/null
  case "$last" in ''|*[!0-9]*) continue;; esac
  age=$(( $(date +%s) - last ))
  if running "$pid"; then
    [ "$age" -gt "$lost" ] || continue
    kill -s TERM -- "-$pid" 2>/dev/null; sleep 2; kill -s KILL -- "-$pid" 2>/dev/null
    reap "$pid"
  elif [ "$age" -le "$keep" ]; then
    [ "$age" -gt "$lost" ] && reap ""
    continue
  fi
  reap ""
  la=$(cat "$w/lost_after" 2>/dev/null)
  echo "$last ${la:--}" > "$w.lost" 2>/dev/null
  chmod -R u+w "$w" 2>/dev/null; rm -rf "$w"
  rmdir "${w%/*}" "${w%/*/*}" 2>/dev/null
  exit 0
done
"""

# The job's own session leader: runs the command with its log, then writes response.json in one
# step, once it ended every process the command left (`reap`: a job's end is its processes' end).
# Its command line holds the attempt's tag, which is how a pid is known to be ours. The
# job's command and environment are files beside it (`command`, `env`), never the start script's
# own variables or this shell's: the environment is read in a subshell just before the command
# runs, with the wrapper's paths held in positional parameters it cannot assign, and `sh` found
# before the job's PATH applies. A command of any length goes this way (an exec's argument or
# environment string is limited to 128 KiB on Linux).
#
# An exit by SIGKILL (137) is judged the kernel's OOM killer's only on the machine's own evidence
# (OOM_EVIDENCE): the count of OOM kills in the wrapper's memory cgroup moved while the job ran, or the
# kernel log gained an OOM killer's line. Then the wrapper says so in the log's last line
# (protocols/verdict.py OOM_KILLER_LINE), which the heartbeat reads with the exit.
#
# What the kernel writes, as its sources spell it (Linux 6.x):
# - cgroup v2 `memory.events` (mm/memcontrol.c memory_events_show, Documentation/admin-guide/
#   cgroup-v2.rst): a line `oom_kill %lu`, counted in the cgroup and its descendants;
# - cgroup v1 `memory.oom_control` (mm/memcontrol-v1.c mem_cgroup_oom_control_read): a line
#   `oom_kill %lu`, counted in that cgroup alone;
# - the kernel log (mm/oom_kill.c): `pr_warn("%s invoked oom-killer: gfp_mask=...")` (dump_header),
#   `pr_info("oom-kill:constraint=%s,nodemask=%*pbl", ...)` (dump_oom_victim) and
#   `pr_err("%s: Killed process %d (%s) total-vm:%lukB, ...")` (__oom_kill_process), the message
#   "Out of memory" or "Memory cgroup out of memory"; read by `dmesg`, else (dmesg_restrict)
#   `journalctl -k` where the user may read the journal.
#
# The kernel log is a ring: a new report pushes the oldest lines out, OOM lines among them, so a count
# of its OOM lines can stay the same across a kill (a full log, as on any machine up for a while: the
# reader missed real kills that way). What is compared is its newest OOM line (a checksum: each holds
# the victim's pid, and its time where the log has times), and a log that lost every OOM line while
# the job ran has no evidence ("-"). The last of them, "Killed process", is written just after the
# SIGKILL: a wrapper that finds nothing yet looks once more a second later.
OOM_EVIDENCE = r"""oom_kills() { v=$(sed -n 's/^oom_kill //p' "$1" 2>/dev/null); printf '%s' "${v:--}"; }
kernel_oom() { l=$(grep -i -e 'out of memory: kill' -e 'oom-kill' | tail -n 1)
  if [ -n "$l" ]; then printf '%s' "$l" | cksum | sed 's/ .*//'; else printf -; fi; }
ooms() { c=$(sed -n 's/^0:://p' /proc/self/cgroup 2>/dev/null); m=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup 2>/dev/null)
  printf '%s %s %s' "$(oom_kills "/sys/fs/cgroup$c/memory.events")" "$(oom_kills "/sys/fs/cgroup/memory$m/memory.oom_control")" \
    "$({ dmesg 2>/dev/null || journalctl -k -b -q --no-pager -o cat 2>/dev/null; } | kernel_oom)"; }
oom_moved() { set -- $1 $2; [ "$1" != "$4" ] || [ "$2" != "$5" ] || { [ "$6" != - ] && [ "$6" != "$3" ]; }; }
"""
WRAPPER = r"""w=$1
cd "$2" || exit 1
""" + OOM_EVIDENCE + r"""k0=$(ooms)
( set -- "$w/env" "$w/command" "$(command -v sh)"; . "$1" && exec "$3" "$2" ) >> "$w/log.txt" 2>&1 < /dev/null
rc=$?
if [ "$rc" = 137 ]; then k1=$(ooms); oom_moved "$k0" "$k1" || { sleep 1; k1=$(ooms); }
  oom_moved "$k0" "$k1" &&
  echo "actor-run: the kernel's OOM killer ended the job (OOM kills of cgroup v2, v1, the kernel log's newest: $k0 before, $k1 after)" >> "$w/log.txt"; fi
""" + TAG + MEMBERS + r"""reap "$$"
printf '{"exit_code": %s, "ended": %s}\n' "$rc" "$(date +%s)" > "$w/response.json.tmp" && mv -f "$w/response.json.tmp" "$w/response.json"
"""


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MARK = "ACTOR_RUN_TAG"  # the attempt's mark in its job's environment (see MEMBERS)
RESERVED_PREFIX = "ACTOR_RUN_"  # the wrapper's own variables (ACTOR_RUN_OUT, ...): a job's env may not set them


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be a job's environment variable, or None when it can."""
    if not ENV_NAME.fullmatch(name):
        return f"environment name {name!r} must match [A-Za-z_][A-Za-z0-9_]*"
    if name.startswith(RESERVED_PREFIX):
        return f"environment name {name!r} is reserved ({RESERVED_PREFIX}* are actor-run's own)"
    return None


def env_file(env: dict[str, str]) -> str:
    """The job's environment as sh reads it with `.`: one `export NAME='value'` a line."""
    for k, v in env.items():
        if not ENV_NAME.fullmatch(k):
            raise ValueError(f"environment name {k!r} must match [A-Za-z_][A-Za-z0-9_]*")
        if "\0" in v:
            raise ValueError(f"environment value of {k} contains a NUL byte")
    return "".join(f"export {k}={q(v)}\n" for k, v in sorted(env.items()))


def start(work: str, cwd: str, command: str, env: dict[str, str], links: list[tuple[str, str]],
          lost: int, every: int, keep: int, request: str, lost_after_s: int = 0) -> str:
    """Start the job detached in its own session with its watchdog; prints the job's pid. With
    `lost_after_s`, it is written beside the heartbeat (`lost_after`) for sweeps to judge the stamp by.
    The command and the environment are written as files by `printf` (a builtin: no exec, so no
    length limit) and reach no shell but the job's own, as data (see WRAPPER)."""
    if "\0" in command:
        raise ValueError("the command contains a NUL byte")
    tag = f"actor-run-{secrets.token_hex(8)}"
    env = {**env, MARK: tag}  # every process the job starts inherits it: how `reap` finds them
    link_lines = "".join(f"mkdir -p {q(dst.rsplit('/', 1)[0])} && ln -sfn {q(src)} {q(dst)}\n" for src, dst in links)
    return (
        "set -e\n"
        f"w={q(work)}\n"
        'mkdir -p "$w/out" "$w/in"\n'
        f"{link_lines}"
        'cat > "$w/request.json"\n'
        ': > "$w/progress.jsonl"; : > "$w/log.txt"\n'
        + (f'echo {int(lost_after_s)} > "$w/lost_after"\n' if lost_after_s > 0 else "")
        + f"{ALIVE}"
        f"printf '%s' {q(command)} > \"$w/command\"\n"
        f"printf '%s' {q(env_file(env))} > \"$w/env\"\n"
        f"tag={tag}; echo \"$tag\" > \"$w/tag\"\n"
        "if command -v setsid >/dev/null 2>&1; then set -- setsid; "
        "else set -- perl -MPOSIX -e 'POSIX::setsid(); exec @ARGV or die'; fi\n"
        f'nohup "$@" sh -c {q(WRAPPER)} actor-run-job "$w" {q(cwd)} "$tag" > /dev/null 2>&1 < /dev/null &\n'
        "pid=$!\n"
        'echo "$pid" > "$w/pid"\n'
        # until the job's session leader has its own command line (a forked child that has not yet
        # exec'd shows this shell's, without the tag: a poll then would call the job lost), bounded
        + RUNNING +
        'n=0; while [ $n -lt 50 ] && ! running "$pid" && [ ! -f "$w/response.json" ]; do sleep 0.1; n=$((n + 1)); done\n'
        f'nohup "$@" sh -c {q(WATCHDOG)} actor-run-watchdog "$w" "$pid" {lost} {every} {keep} > /dev/null 2>&1 < /dev/null &\n'
        'echo $! > "$w/watchdog.pid"\n'
        'echo "$pid"\n'
    )


# A file's size and modification time (`0 0` if it is missing), in one exec where `stat` has GNU's
# (`-c`) or BSD's (`-f`) options, else through `wc` and `date`: a poll asks this of two files each time.
SIZE = r"""size() { [ -f "$1" ] || { echo 0 0; return 0; }
  stat -L -c '%s %Y' -- "$1" 2>/dev/null || stat -L -f '%z %m' -- "$1" 2>/dev/null ||
  echo "$(wc -c < "$1" 2>/dev/null || echo 0) $(date -r "$1" +%s 2>/dev/null || echo 0)"; }
"""


def poll(work: str, pid: int, progress_at: int, log_at: int, max_log: int, max_progress: int = 1 << 20) -> str:
    """Write the heartbeat, then say: `running`, `exited <code>` or `lost`; the sizes of the
    progress file and log (as far as this read goes: at most `max_progress` and `max_log` new bytes)
    and their modification times, and the log's whole size; then the new bytes of each."""
    return (
        f"w={q(work)}\n"
        f'[ -d "$w" ] || {{ echo gone; echo 0 0; exit 0; }}\n'
        + ALIVE + RUNNING +
        f"if running {pid}; then echo running\n"
        'elif [ -f "$w/response.json" ]; then echo "exited $(sed -n \'s/.*"exit_code": *\\(-\\{0,1\\}[0-9]*\\).*/\\1/p\' "$w/response.json")"\n'
        "else echo lost; fi\n"
        + SIZE +
        'set -- $(size "$w/progress.jsonl") $(size "$w/log.txt"); p=$1 pm=$2 l=$3 lm=$4 lt=$3\n'
        f"[ $p -gt $(({progress_at} + {max_progress})) ] && p=$(({progress_at} + {max_progress}))\n"
        f"[ $l -gt $(({log_at} + {max_log})) ] && l=$(({log_at} + {max_log}))\n"
        "echo $p $l $pm $lm $lt\n"
        f'if [ $p -gt {progress_at} ]; then tail -c +{progress_at + 1} "$w/progress.jsonl" 2>/dev/null | head -c $((p - {progress_at})); fi\n'
        f'if [ $l -gt {log_at} ]; then tail -c +{log_at + 1} "$w/log.txt" 2>/dev/null | head -c $((l - {log_at})); fi\n'
    )


def alive(work: str) -> str:
    return f"w={q(work)}\n[ -d \"$w\" ] || exit 0\n" + ALIVE


def stop(work: str) -> str:
    """Stop the job's process group (if that pid is still our job), waiting up to 5 s before KILL,
    then every other process of the attempt (`reap`: its mark, its session), however it detached."""
    return (
        f"w={q(work)}\n"
        '[ -d "$w" ] || exit 0\n'
        'touch "$w/stop"\n'
        'pid=$(cat "$w/pid" 2>/dev/null) || pid=0\n'
        + RUNNING + MEMBERS +
        'sid=; if running "$pid"; then sid=$pid\n'
        '  kill -s TERM -- "-$pid" 2>/dev/null\n'
        '  n=0; while [ $n -lt 50 ] && running "$pid"; do sleep 0.1; n=$((n + 1)); done\n'
        '  kill -s KILL -- "-$pid" 2>/dev/null; fi\n'
        'reap "$sid"; exit 0\n'
    )


def started(work: str) -> str:
    """Whether a job was started in `work` by a controller that died before it could say so: prints
    `<pid> <mtime of the pid file>` when the start script wrote the pid, `0 0` when it never ran.
    A start cut off between launching the job and writing its pid (its tag is there, its pid not)
    has everything carrying the tag ended first, so that a fresh start is the only run."""
    return (
        f"w={q(work)}\n"
        '[ -d "$w" ] || { echo 0 0; exit 0; }\n'
        + SIZE +
        'p=; { read -r p < "$w/pid"; } 2>/dev/null || :\n'
        'case "$p" in ""|*[!0-9]*) ;; *) set -- $(size "$w/pid"); echo "$p $2"; exit 0;; esac\n'
        '[ -f "$w/tag" ] || { echo 0 0; exit 0; }\n'
        + RUNNING + MEMBERS +
        'reap ""; echo 0 0\n'
    )


def fetchable(work: str, names: list[str] | None = None) -> str:
    """Which of out/ and progress.jsonl (or of `names`, paths under out/) exist and are not links,
    nor under one. Not response.json: the poll read the exit code from it already."""
    if names is None:
        return (
            f"cd {q(work)} 2>/dev/null || exit 0\n"
            "[ -d out ] && [ ! -L out ] && echo out\n"
            "[ -f progress.jsonl ] && [ ! -L progress.jsonl ] && echo progress.jsonl\n"
            "exit 0\n"
        )
    checks = "".join(
        f"p={q(n)}; ok=1; d=$p; while [ -n \"$d\" ] && [ \"$d\" != . ]; do [ -L \"$d\" ] && ok=0; "
        f"case $d in */*) d=${{d%/*}};; *) d=;; esac; done; [ $ok = 1 ] && [ -e \"$p\" ] && echo \"$p\"\n"
        for n in names if n.startswith("out/") and ".." not in n.split("/")
    )
    return f"cd {q(work)} 2>/dev/null || exit 0\n[ -L out ] && exit 0\n{checks}exit 0\n"


def remove(work: str) -> str:
    parent = work.rsplit("/", 1)[0]
    return discard(work) + f"rmdir {q(parent)} {q(parent.rsplit('/', 1)[0])} 2>/dev/null; exit 0\n"


def beats(base: str) -> str:
    """The host's clock (`now <t>`), then `<alive stamp> <lost_after or ->` for each attempt under
    `base` (`<job>/<seed>/a<n>`) with a heartbeat stamp (the clock the watchdog reads), or with the
    tombstone its watchdog left when it removed the folder."""
    return (
        "echo \"now $(date +%s)\"\n"
        f"[ -d {q(base)} ] || exit 0\n"
        f"find {q(base)} -mindepth 3 -maxdepth 4 -type f \\( -name alive -o -name 'a*.lost' \\) 2>/dev/null |\n"
        "while IFS= read -r f; do\n"
        '  case "$f" in\n'
        '    */alive) t=$(cat "$f" 2>/dev/null); l=$(cat "${f%/alive}/lost_after" 2>/dev/null); echo "${t:-x} ${l:--}";;\n'
        '    *) head -n 1 "$f" 2>/dev/null;;\n'
        "  esac\n"
        "done\n"
        "exit 0\n"
    )
