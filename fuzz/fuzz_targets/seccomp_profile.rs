//! OCI/Docker seccomp JSON profiles: `seccomp::profile::parse` and the
//! compilation to classic BPF, as `--seccomp FILE` does it (the network
//! policy's socket rules in front, ptrace syscalls allowed when asked).
//!
//! The first byte picks ptrace, the network policy and the kernel version
//! `minKernel` is tested against; the rest is the profile.
//!
//! Checked: no panic; errors are one line naming the profile; a program
//! the kernel would accept (at most 4096 instructions, jumps in range, a
//! final `ret`) that agrees with the reference evaluator (the plain
//! meaning of the rules: the first matching rule wins) for every syscall
//! number near those with rules, with the argument values the rules care
//! about, with the x32 bit, for another architecture, and for argument
//! vectors taken from the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox::seccomp::bpf::check;
use sandbox::seccomp::profile::{Arch, Target};
use tuixiu_sandbox_fuzz::assert_one_line;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, json)) = data.split_first() else { return };
    let Ok(json) = std::str::from_utf8(json) else { return };
    let target =
        Target { arch: Arch::NATIVE, kernel: [(4, 14), (5, 15), (6, 8)][usize::from(flags >> 3) % 3] };
    let (rules, default, program) =
        match sandbox::seccomp::compile_for_check(json, &target, flags & 1 != 0, (flags >> 1) & 3) {
            Ok(compiled) => compiled,
            Err(e) => {
                assert!(e.starts_with("seccomp profile fuzz.json: "), "{e}");
                return assert_one_line("seccomp error", &e);
            }
        };
    if program.len() > 4096 {
        // `seccomp::compile` refuses it with a message naming the size.
        return;
    }
    let filter = sandbox::seccomp::native_filter_for_check(&rules, default);
    let checked = check::assert_matches_reference(&filter);
    let same = checked.len() == program.len()
        && checked.iter().zip(&program).all(|(a, b)| (a.code, a.jt, a.jf, a.k) == (b.code, b.jt, b.jf, b.k));
    assert!(same, "compiling the same rules twice gave two programs");

    // A few syscalls with arguments from the input itself.
    let mut words = json.as_bytes().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()));
    for rule in rules.iter().take(16) {
        let args: [u64; 6] = std::array::from_fn(|_| words.next().unwrap_or(0));
        let want = check::reference(&filter, filter.audit_arch, rule.nr, args);
        let got = check::run(&program, filter.audit_arch, rule.nr, args);
        assert_eq!(got, want, "nr {}, args {args:#x?}", rule.nr);
    }
});
