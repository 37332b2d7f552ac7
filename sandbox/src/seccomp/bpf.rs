//! A small classic-BPF generator for seccomp filters.
//!
//! Why not seccompiler: one seccompiler filter has a single match action,
//! so a profile that mixes EPERM, ENOSYS and EAFNOSUPPORT would need one
//! stacked filter per action (each evaluated on every syscall), and it does
//! not reject the x32 bit (rust-vmm/seccompiler#74). The program shape we
//! need is simple enough to generate directly:
//!
//! ```text
//!   ld arch; jeq NATIVE ? next : KILL_PROCESS
//!   ld nr;   [x86_64] jge 0x40000000 ? KILL_PROCESS : next      (x32 ABI)
//!   binary search on nr (jge) down to leaves: jeq NR → ja body; else ret default
//!   bodies (shared when identical): rule 1 (args ANDed) → ret action;
//!                                   rule 2 ...; ret default
//! ```
//!
//! Argument comparisons are 64-bit, done as two 32-bit halves (the BPF
//! machine is 32-bit); a mask expresses a deliberate 32-bit compare, e.g.
//! `ioctl` requests, whose upper half the kernel ignores (CVE-2019-10063).

use libc::sock_filter;

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const BPF_LD: u16 = 0x00;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_ALU: u16 = 0x04;
const BPF_AND: u16 = 0x50;
const BPF_JMP: u16 = 0x05;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGT: u16 = 0x20;
const BPF_JGE: u16 = 0x30;
const BPF_K: u16 = 0x00;
const BPF_RET: u16 = 0x06;

// struct seccomp_data offsets.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;

pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
pub const RET_KILL_THREAD: u32 = 0x0000_0000;
pub const RET_TRAP: u32 = 0x0003_0000;
pub const RET_ERRNO: u32 = 0x0005_0000;
pub const RET_LOG: u32 = 0x7ffc_0000;
pub const RET_ALLOW: u32 = 0x7fff_0000;

/// `__X32_SYSCALL_BIT`: x32 syscalls are x86_64 numbers with this bit set.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A 64-bit comparison of one syscall argument (libseccomp's operators).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq(u64),
    Ne(u64),
    Lt(u64),
    Le(u64),
    Gt(u64),
    Ge(u64),
    /// `(arg & mask) == value`
    MaskedEq {
        mask: u64,
        value: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cond {
    pub arg: u8,
    pub op: Op,
}

/// One rule: when the syscall is `nr` and every condition holds, return `ret`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub nr: u32,
    pub conds: Vec<Cond>,
    pub ret: u32,
}

/// What to build: the architecture check, the rules and the default.
pub struct Filter<'a> {
    pub audit_arch: u32,
    /// Reject syscall numbers with the x32 bit (x86_64 only).
    pub reject_x32: bool,
    pub rules: &'a [Rule],
    pub default: u32,
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn ret(k: u32) -> sock_filter {
    stmt(BPF_RET | BPF_K, k)
}

/// Compiles the filter. Rules for the same syscall keep their relative
/// order (the first that matches wins).
///
/// The syscall number is dispatched through a balanced tree of `jge`
/// (about log2(n) steps) instead of a chain of `jeq`: the kernel emulates
/// the filter for every syscall number when it is installed (to cache the
/// always-allowed ones), and runs it on every syscall, so the path length
/// matters more than the program size. Identical bodies are shared.
pub fn compile(filter: &Filter<'_>) -> Vec<sock_filter> {
    let mut prog = vec![
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, filter.audit_arch, 1, 0),
        ret(RET_KILL_PROCESS),
        stmt(BPF_LD | BPF_W | BPF_ABS, OFF_NR),
    ];
    if filter.reject_x32 {
        prog.push(jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1));
        prog.push(ret(RET_KILL_PROCESS));
    }

    // One body per syscall: its rules in order, then `ret default`. A rule
    // without conditions always matches, so nothing after it is reachable.
    let mut nrs: Vec<u32> = filter.rules.iter().map(|r| r.nr).collect();
    nrs.sort_unstable();
    nrs.dedup();
    let mut bodies: Vec<Vec<sock_filter>> = Vec::new();
    let mut leaves: Vec<(u32, usize)> = Vec::with_capacity(nrs.len());
    for nr in nrs {
        let mut body = Vec::new();
        let mut complete = false;
        for rule in filter.rules.iter().filter(|r| r.nr == nr) {
            body.extend(compile_rule(rule));
            if rule.conds.is_empty() {
                complete = true;
                break;
            }
        }
        if !complete {
            body.push(ret(filter.default));
        }
        if body.len() == 1 && body[0].k == filter.default {
            continue; // a rule that changes nothing
        }
        let key = |b: &[sock_filter]| b.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect::<Vec<_>>();
        let index = match bodies.iter().position(|b| key(b) == key(&body)) {
            Some(i) => i,
            None => {
                bodies.push(body);
                bodies.len() - 1
            }
        };
        leaves.push((nr, index));
    }

    let mut fixups: Vec<(usize, usize)> = Vec::new(); // (position of a `ja`, body)
    dispatch(&leaves, filter.default, &mut prog, &mut fixups);
    let mut starts = Vec::with_capacity(bodies.len());
    for body in bodies {
        starts.push(prog.len());
        prog.extend(body);
    }
    for (at, body) in fixups {
        prog[at].k = (starts[body] - at - 1) as u32;
    }
    prog
}

/// Emits the dispatch on the syscall number (in the accumulator) over
/// `leaves`, sorted by number: a `ja` to the leaf's body when it matches,
/// `ret default` when none does.
fn dispatch(
    leaves: &[(u32, usize)],
    default: u32,
    prog: &mut Vec<sock_filter>,
    fixups: &mut Vec<(usize, usize)>,
) {
    if leaves.len() <= 3 {
        for (nr, body) in leaves {
            prog.push(jump(BPF_JMP | BPF_JEQ | BPF_K, *nr, 0, 1));
            fixups.push((prog.len(), *body));
            prog.push(stmt(BPF_JMP | BPF_JA, 0));
        }
        prog.push(ret(default));
        return;
    }
    let mid = leaves.len() / 2;
    // nr >= pivot: take the `ja` to the right half; else skip it.
    prog.push(jump(BPF_JMP | BPF_JGE | BPF_K, leaves[mid].0, 0, 1));
    let ja_right = prog.len();
    prog.push(stmt(BPF_JMP | BPF_JA, 0));
    dispatch(&leaves[..mid], default, prog, fixups);
    prog[ja_right].k = (prog.len() - ja_right - 1) as u32;
    dispatch(&leaves[mid..], default, prog, fixups);
}

/// The conditions of one rule, each jumping to the rule's end on failure,
/// followed by `ret action`. A rule is at most 6 conditions of 5
/// instructions, so every jump fits in the 8-bit offsets.
fn compile_rule(rule: &Rule) -> Vec<sock_filter> {
    // Placeholder targets, resolved once the rule's length is known.
    const PASS: u8 = 0xfe;
    const FAIL: u8 = 0xff;
    let mut code: Vec<sock_filter> = Vec::new();
    let mut block_ends: Vec<(usize, usize)> = Vec::new(); // (block start, block end)
    for cond in &rule.conds {
        let start = code.len();
        let lo_off = OFF_ARGS + 8 * u32::from(cond.arg);
        let hi_off = lo_off + 4;
        let ld = |off| stmt(BPF_LD | BPF_W | BPF_ABS, off);
        let jeq = |k, jt, jf| jump(BPF_JMP | BPF_JEQ | BPF_K, k, jt, jf);
        let jgt = |k, jt, jf| jump(BPF_JMP | BPF_JGT | BPF_K, k, jt, jf);
        let jge = |k, jt, jf| jump(BPF_JMP | BPF_JGE | BPF_K, k, jt, jf);
        let value = match cond.op {
            Op::Eq(v) | Op::Ne(v) | Op::Lt(v) | Op::Le(v) | Op::Gt(v) | Op::Ge(v) => v,
            Op::MaskedEq { value, .. } => value,
        };
        let (hi, lo) = ((value >> 32) as u32, value as u32);
        // 0 = fall through to the next instruction.
        match cond.op {
            Op::Eq(_) => code.extend([ld(hi_off), jeq(hi, 0, FAIL), ld(lo_off), jeq(lo, 0, FAIL)]),
            Op::Ne(_) => code.extend([ld(hi_off), jeq(hi, 0, PASS), ld(lo_off), jeq(lo, FAIL, PASS)]),
            Op::MaskedEq { mask, .. } => code.extend([
                ld(hi_off),
                stmt(BPF_ALU | BPF_AND | BPF_K, (mask >> 32) as u32),
                jeq(hi, 0, FAIL),
                ld(lo_off),
                stmt(BPF_ALU | BPF_AND | BPF_K, mask as u32),
                jeq(lo, 0, FAIL),
            ]),
            Op::Gt(_) => {
                code.extend([ld(hi_off), jgt(hi, PASS, 0), jeq(hi, 0, FAIL), ld(lo_off), jgt(lo, PASS, FAIL)])
            }
            Op::Ge(_) => {
                code.extend([ld(hi_off), jgt(hi, PASS, 0), jeq(hi, 0, FAIL), ld(lo_off), jge(lo, PASS, FAIL)])
            }
            Op::Lt(_) => {
                code.extend([ld(hi_off), jgt(hi, FAIL, 0), jeq(hi, 0, PASS), ld(lo_off), jge(lo, FAIL, PASS)])
            }
            Op::Le(_) => {
                code.extend([ld(hi_off), jgt(hi, FAIL, 0), jeq(hi, 0, PASS), ld(lo_off), jgt(lo, FAIL, PASS)])
            }
        }
        block_ends.push((start, code.len()));
    }
    code.push(ret(rule.ret));
    let fail_at = code.len(); // the first instruction after this rule
    for (start, end) in block_ends {
        for (i, ins) in code.iter_mut().enumerate().take(end).skip(start) {
            let resolve = |t: u8| -> u8 {
                let target = match t {
                    PASS => end,
                    FAIL => fail_at,
                    _ => return t,
                };
                u8::try_from(target - i - 1).expect("rule jumps fit in 8 bits")
            };
            if ins.code & 0x07 == BPF_JMP {
                ins.jt = resolve(ins.jt);
                ins.jf = resolve(ins.jf);
            }
        }
    }
    code
}

/// Runs a program the way the kernel does, for tests: returns the action.
#[cfg(test)]
pub fn run(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&nr.to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    loop {
        let ins = prog[pc];
        match ins.code {
            c if c == BPF_LD | BPF_W | BPF_ABS => {
                let o = ins.k as usize;
                acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
            }
            c if c == BPF_ALU | BPF_AND | BPF_K => acc &= ins.k,
            c if c == BPF_JMP | BPF_JA => pc += ins.k as usize,
            c if c & 0x07 == BPF_JMP => {
                let taken = match c & 0xf0 {
                    BPF_JEQ => acc == ins.k,
                    BPF_JGT => acc > ins.k,
                    BPF_JGE => acc >= ins.k,
                    _ => panic!("unexpected jump {c:#x}"),
                };
                pc += usize::from(if taken { ins.jt } else { ins.jf });
            }
            c if c == BPF_RET | BPF_K => return ins.k,
            c => panic!("unexpected opcode {c:#x}"),
        }
        pc += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARCH: u32 = 0xC000_003E;

    fn prog(rules: &[Rule]) -> Vec<sock_filter> {
        compile(&Filter { audit_arch: ARCH, reject_x32: true, rules, default: RET_ALLOW })
    }

    #[test]
    fn arch_and_x32_are_checked_first() {
        let p = prog(&[]);
        assert_eq!(run(&p, ARCH, 39, [0; 6]), RET_ALLOW);
        assert_eq!(run(&p, 0x4000_0003, 39, [0; 6]), RET_KILL_PROCESS);
        assert_eq!(run(&p, ARCH, X32_SYSCALL_BIT | 39, [0; 6]), RET_KILL_PROCESS);
    }

    #[test]
    fn comparisons_are_64_bit() {
        let cases: &[(Op, &[(u64, bool)])] = &[
            (Op::Eq(5), &[(5, true), (5 | 1 << 32, false), (4, false)]),
            (Op::Ne(5), &[(5, false), (5 | 1 << 32, true), (6, true)]),
            (Op::Gt(1 << 32), &[(1 << 32, false), ((1 << 32) + 1, true), (u32::MAX as u64, false)]),
            (Op::Ge(1 << 32), &[(1 << 32, true), (u32::MAX as u64, false), (u64::MAX, true)]),
            (Op::Lt(10), &[(9, true), (10, false), (1 << 32, false)]),
            (Op::Le(10), &[(10, true), (11, false), (0, true), (10 | 1 << 40, false)]),
            (
                Op::MaskedEq { mask: 0xffff_ffff, value: 0x5412 },
                &[(0x5412, true), (0xdead_0000_0000_5412, true), (0x5413, false)],
            ),
        ];
        for (op, values) in cases {
            let p = prog(&[Rule { nr: 16, conds: vec![Cond { arg: 1, op: *op }], ret: RET_ERRNO | 1 }]);
            for (value, matches) in values.iter() {
                let got = run(&p, ARCH, 16, [0, *value, 0, 0, 0, 0]);
                let want = if *matches { RET_ERRNO | 1 } else { RET_ALLOW };
                assert_eq!(got, want, "{op:?} on {value:#x}");
            }
        }
    }

    #[test]
    fn conditions_and_rules_combine() {
        let rules = [
            // socket(domain not in {1, 2}) → EAFNOSUPPORT
            Rule {
                nr: 41,
                conds: vec![Cond { arg: 0, op: Op::Ne(1) }, Cond { arg: 0, op: Op::Ne(2) }],
                ret: RET_ERRNO | 97,
            },
            Rule { nr: 272, conds: vec![], ret: RET_ERRNO | 1 },
            Rule { nr: 41, conds: vec![Cond { arg: 1, op: Op::Eq(3) }], ret: RET_ERRNO | 13 },
        ];
        let p = prog(&rules);
        assert_eq!(run(&p, ARCH, 41, [1, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, ARCH, 41, [2, 1, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, ARCH, 41, [40, 1, 0, 0, 0, 0]), RET_ERRNO | 97);
        assert_eq!(run(&p, ARCH, 41, [2, 3, 0, 0, 0, 0]), RET_ERRNO | 13);
        assert_eq!(run(&p, ARCH, 272, [0; 6]), RET_ERRNO | 1);
        assert_eq!(run(&p, ARCH, 0, [0; 6]), RET_ALLOW);
    }

    #[test]
    fn dispatch_tree_finds_every_syscall() {
        // Many syscalls, interleaved actions, some with conditions.
        let rules: Vec<Rule> = (0..200u32)
            .filter(|n| n % 3 != 0)
            .map(|nr| Rule {
                nr,
                conds: if nr % 5 == 0 { vec![Cond { arg: 0, op: Op::Eq(7) }] } else { vec![] },
                ret: RET_ERRNO | (nr % 4 + 1),
            })
            .collect();
        let p = prog(&rules);
        for nr in 0..260u32 {
            let want = match rules.iter().find(|r| r.nr == nr) {
                None => RET_ALLOW,
                Some(r) if r.conds.is_empty() => r.ret,
                Some(_) => RET_ALLOW,
            };
            assert_eq!(run(&p, ARCH, nr, [0; 6]), want, "nr {nr}");
            if let Some(r) = rules.iter().find(|r| r.nr == nr) {
                assert_eq!(run(&p, ARCH, nr, [7, 0, 0, 0, 0, 0]), r.ret, "nr {nr} with arg");
            }
        }
        // The longest path is logarithmic, not linear.
        assert!(p.len() < 600, "{}", p.len());
    }
}
