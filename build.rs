//! Link options that make the binaries start faster and smaller.
//!
//! 1. Packed relative relocations (`-z pack-relative-relocs`, DT_RELR) for
//!    both binaries: the full tool has ~29 000 relative relocations; as a
//!    classic RELA table that is 728 KB the dynamic loader reads at every
//!    start (page faults, and resident memory: the daemon's idle RSS fell
//!    by about 0.4 MiB), as RELR about 13 KB. Enabled only when the C
//!    toolchain links with it cleanly and the host's glibc (which then runs
//!    the binaries) is 2.36 or newer.
//!
//! 2. The launcher binary (`tuixiu-sandbox`) links libgcc's unwinder
//!    statically instead of `libgcc_s.so`.
//!
//! Every sandbox start execs the launcher, and loading `libgcc_s.so` runs
//! its `__cpu_indicator_init` constructor: a series of `cpuid`
//! instructions, each a VM exit under a hypervisor (measured here: 0.14 ms
//! per exec, about 3% of a sandbox start). rustc asks for `-lgcc_s` by
//! name, so this points the linker, for that one binary only, at a
//! directory where `libgcc_s.a` is libgcc's static unwinder (`libgcc_eh.a`,
//! what Rust's static builds use). Without gcc's `libgcc_eh.a` (e.g. a
//! clang-only toolchain) nothing changes: the binary links `libgcc_s.so`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host || !target.ends_with("-linux-gnu") {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    if supports_relr(&cc) {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let Ok(out) = Command::new(&cc).arg("-print-file-name=libgcc_eh.a").output() else { return };
    let eh = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !eh.is_absolute() || !eh.is_file() {
        return;
    }
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("static-libgcc");
    let link = dir.join("libgcc_s.a");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::remove_file(&link);
    if std::os::unix::fs::symlink(&eh, &link).is_err() {
        return;
    }
    println!("cargo::rustc-link-arg-bin=tuixiu-sandbox=-L{}", dir.display());
}

/// Whether `cc` links a program with packed relative relocations without a
/// warning, and the glibc here loads them (DT_RELR needs glibc 2.36).
fn supports_relr(cc: &str) -> bool {
    let glibc = Command::new("getconf").arg("GNU_LIBC_VERSION").output().ok();
    let new_enough = glibc
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            let version = v.trim().strip_prefix("glibc ")?.to_string();
            let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .is_some_and(|(major, minor)| (major, minor) >= (2, 36));
    if !new_enough {
        return false;
    }
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = dir.join("relr-probe.c");
    let bin = dir.join("relr-probe");
    if std::fs::write(&src, "static int x; int *p = &x; int main(void) { return *p; }\n").is_err() {
        return false;
    }
    let Ok(out) = Command::new(cc)
        .arg("-pie")
        .arg("-fPIE")
        .arg("-Wl,-z,pack-relative-relocs")
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
    else {
        return false;
    };
    out.status.success() && out.stderr.is_empty() && Command::new(&bin).status().is_ok_and(|s| s.success())
}
