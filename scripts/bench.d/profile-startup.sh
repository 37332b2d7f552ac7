#!/usr/bin/env bash
# bench: where startup time goes: syscalls, perf stat, perf record (anchor: `unshare -Urmpf --mount-proc`)
# Where the startup time of `tuixiu-sandbox run -- /bin/true` goes, next to
# the bare-namespace floor `unshare -Urmpf --mount-proc /bin/true`
# (docs/benchmarks.md, "against the bare namespaces").
#
#   scripts/bench profile-startup            # as the current user, 300 starts each
#   RUNS=500 scripts/bench profile-startup
#   AS_USER=nobody scripts/bench profile-startup   # unprivileged (needs root)
#
# Three views, each of ours and of unshare's:
#  1. syscall counts of one start (`strace -f -c`, /bin/true included);
#  2. CPU time, context switches, migrations and page faults per start,
#     all processes included (`perf stat -r RUNS`);
#  3. the CPU time per start by syscall (kernel side) and by user-space
#     part, from `perf record -g` samples over RUNS starts (15 kHz).
# Needs strace and perf (linux-perf), and to be allowed to profile the
# kernel (root, or kernel.perf_event_paranoid <= 1); with AS_USER, perf
# runs as root and the starts as the user.
source "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-300}
for tool in strace perf unshare; do
    command -v "$tool" >/dev/null || { echo "profile-startup: $tool not found" >&2; exit 1; }
done
bench_build --bin tuixiu-sandbox
dir=$(bench_scratch)
chmod 755 "$dir"
cp "$REL/tuixiu-sandbox" "$dir/"
mkdir "$dir/ws"
wrap=()
if [ -n "${AS_USER:-}" ]; then
    chown "$AS_USER" "$dir/ws"
    wrap=(setpriv --reuid "$(id -u "$AS_USER")" --regid "$(id -g "$AS_USER")" --clear-groups)
fi
ours=("$dir/tuixiu-sandbox" run --workspace "$dir/ws" -- /bin/true)
floor=(unshare -Urmpf --mount-proc /bin/true)
bench_machine "caller uid $("${wrap[@]}" id -u)"
echo "load average before: $(bench_load)"

echo "== 1. syscalls of one start (strace -f -c; calls, errors)"
for name in ours floor; do
    declare -n cmd=$name
    "${wrap[@]}" strace -f -c "${cmd[@]}" 2>"$dir/$name.strace"
    printf '%-6s %s\n' "$name" "$(tail -n 1 "$dir/$name.strace" | awk '{print $4 " calls, " $5 " errors"}')"
done
echo "   ours, most frequent:"
sed -n '3,$p' "$dir/ours.strace" | sort -k4 -n -r | awk 'NF>=5 && $NF!="total" {print "     " $4 "\t" $NF}' | head -20

echo "== 2. per start, all processes (perf stat -r $RUNS)"
for name in ours floor; do
    declare -n cmd=$name
    printf '%-6s ' "$name"
    "${wrap[@]}" perf stat -r "$RUNS" -x, -e task-clock,context-switches,cpu-migrations,page-faults -- "${cmd[@]}" 2>&1 >/dev/null |
        awk -F, '{printf "%s %s %s; ", $1, $2, $3} END {print ""}'
done

echo "== 3. CPU time per start by syscall / user-space part (perf record, $RUNS starts)"
for name in ours floor; do
    declare -n cmd=$name
    printf -v loop '%q ' "${cmd[@]}"
    # perf itself as the caller (root), so that it may sample the kernel;
    # the loop as the user.
    perf record -q -o "$dir/$name.data" -F 15000 -g -- "${wrap[@]}" sh -c "for i in \$(seq $RUNS); do $loop; done" >/dev/null 2>&1
    perf script -i "$dir/$name.data" -F comm,ip,sym 2>/dev/null >"$dir/$name.script"
done
python3 - "$dir/ours.script" "$dir/floor.script" "$RUNS" <<'PY'
import collections, re, sys
ours, floor, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
per_sample = 1e6 / 15000 / runs  # µs per start that one sample stands for
SYSCALL = re.compile(r"^(__x64_sys_|__do_sys_|__se_sys_|__ia32_sys_)")
CPUID = {"handle_amd", "handle_intel", "init_cpu_features", "update_active", "get_common_indices",
         "get_extended_indices", "init_cacheinfo", "dl_init_cacheinfo", "intel_check_word"}

def key(frames):
    """What one sample was doing: the syscall it was in, a page fault, the
    process start (exec, glibc's CPU-feature probe), or user code."""
    for f in frames:
        if SYSCALL.match(f):
            return "sys " + SYSCALL.sub("", f).split(".")[0]
    if "do_syscall_64" in frames:
        # A syscall whose entry point was inlined (ksys_write, do_seccomp,
        # kernel_wait4, ...): name it by do_syscall_64's callee.
        i = frames.index("do_syscall_64")
        if i > 0:
            name = re.sub(r"^(ksys_|kernel_|do_|__)", "", frames[i - 1].split(".")[0])
            return "sys " + {"mmap_pgoff": "mmap", "vm_mmap_pgoff": "mmap"}.get(name, name)
    if "asm_exc_page_fault" in frames:
        return "page faults"
    if frames and any(f.split(".")[0] in CPUID for f in frames):
        return "user: glibc CPU-feature probe (cpuid)"
    if frames and frames[-1] in ("ret_from_fork_asm", "ret_from_fork"):
        return "kernel: new task start"
    if any(f.startswith(("entry_SYSCALL", "asm_", "do_syscall")) for f in frames):
        return "kernel: other"
    return "user: other"

def load(path):
    counts, comm, frames = collections.Counter(), None, []
    def flush():
        if comm is not None and comm not in ("sh", "seq", "perf", "setpriv"):
            counts[key(frames)] += 1
    for line in open(path):
        if not line.strip():
            flush(); comm, frames = None, []
        elif not line[0].isspace():
            comm, frames = line.split()[0], []
        else:
            parts = line.split(None, 1)
            frames.append(parts[1].strip() if len(parts) > 1 else "?")
    flush()
    return {k: v * per_sample for k, v in counts.items()}

a, b = load(ours), load(floor)
print(f"   {'':44} {'ours µs':>9} {'unshare µs':>11} {'difference':>11}")
for k in sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) - b.get(k, 0))):
    x, y = a.get(k, 0), b.get(k, 0)
    if max(x, y) >= 5:
        print(f"   {k:44} {x:9.0f} {y:11.0f} {x - y:+11.0f}")
print(f"   {'total CPU per start (sampled)':44} {sum(a.values()):9.0f} {sum(b.values()):11.0f} {sum(a.values()) - sum(b.values()):+11.0f}")

GROUPS = [
    ("mount tree", "openat2 fsconfig fsopen fsmount open_tree move_mount mount_setattr mkdirat symlinkat "
     "unlinkat pivot_root umount mount fchdir chdir sethostname"),
    ("processes, namespaces, hand-overs", "clone clone3 vfork unshare kill wait4 poll pipe2 exit_group setsid "
     "setresuid setresgid setgroups exit_to_user_mode_loop signalfd4 rt_sigprocmask rt_sigaction"),
    ("seccomp, Landlock, capabilities", "seccomp landlock_create_ruleset landlock_add_rule landlock_restrict_self "
     "prctl capset close_range"),
    ("files and paths (checks, id maps, reads)", "openat close statx readlink getdents64 read write newfstatat "
     "access socket bind listen dup2 fcntl ioctl"),
    ("exec, memory, page faults", "execve mmap munmap mprotect brk madvise"),
]
def group(k):
    if k == "page faults":
        return "exec, memory, page faults"
    if k.startswith("user"):
        return "user space: " + ("glibc start (cpuid)" if "cpuid" in k else "program code")
    name = k[4:] if k.startswith("sys ") else k
    return next((g for g, names in GROUPS if name in names.split()), "other kernel work")
ga, gb = collections.Counter(), collections.Counter()
for k, v in a.items():
    ga[group(k)] += v
for k, v in b.items():
    gb[group(k)] += v
print()
print(f"   {'grouped':44} {'ours µs':>9} {'unshare µs':>11} {'difference':>11}")
for g in sorted(set(ga) | set(gb), key=lambda g: -(ga[g] - gb[g])):
    print(f"   {g:44} {ga[g]:9.0f} {gb[g]:11.0f} {ga[g] - gb[g]:+11.0f}")
PY
echo "load average after: $(bench_load)"
