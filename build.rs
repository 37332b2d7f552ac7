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
//! 2. The launcher binary (`tuixiu-sandbox`) is linked as a static PIE
//!    (glibc's `libc.a`, libgcc's static unwinder), as rustc's
//!    `crt-static` would link it. Every sandbox start execs the launcher,
//!    and a dynamic start costs far more than the sandbox's own steps
//!    suggest: the dynamic loader maps `libc.so` and resolves some 200
//!    symbols, and `libgcc_s.so`'s constructor issues a series of `cpuid`
//!    instructions, each a VM exit under a hypervisor. Measured here:
//!    0.86 ms for a dynamic hello-world against 0.60 ms static, and the
//!    sandbox start 0.3 ms faster (docs/benchmarks.md). The launcher
//!    needs nothing that a static glibc handles badly (no NSS lookups, no
//!    `dlopen`). `crt-static` itself cannot be set for one binary of a
//!    package (and a target-wide flag breaks proc-macro crates), so this
//!    gives the linker what `crt-static` would: `-static-pie`, and two
//!    directories, searched first, where each library rustc asks for by
//!    name is its static archive: `unwinder-libs` (`libgcc_s.a` being
//!    `libgcc_eh.a`, as in Rust's static builds) and `glibc-libs` (`-lc`,
//!    `-lm`, ...).
//!
//!    Where the toolchain cannot link a static PIE, the launcher still
//!    gets the static unwinder alone (no `libgcc_s.so` constructor); where
//!    even `libgcc_eh.a` is missing (a clang-only toolchain), it links as
//!    usual. `TUIXIU_DYNAMIC_LAUNCHER=1` at build time asks for the usual
//!    dynamic link.
//!
//! 3. `TUIXIU_STATIC=1` at build time links the full tool and the daemon
//!    the same way, for images without a C library (`FROM scratch`,
//!    deploy/container). They need nothing else there: with no
//!    `/etc/nsswitch.conf`, or one that names only `files` and `dns`,
//!    static glibc resolves names and users itself (checked with strace: no
//!    module is opened). By default they stay dynamic, because a host's
//!    `nsswitch.conf` may name other modules (`mdns4_minimal`, `resolve`,
//!    `sss`), which a static glibc `dlopen`s together with the host's
//!    `libc.so.6`: safe only when that is the glibc it was built with. (The
//!    static daemon idles 0.8 MiB smaller: docs/benchmarks.md.)
//!
//! 4. The full tool and the daemon, dynamic by default, link the static
//!    unwinder (`libgcc_eh.a` found where rustc asks for `-lgcc_s`), as the
//!    launcher does: no `libgcc_s.so.1` to map and relocate, and no constructor
//!    issuing `cpuid` at every start. With `panic = "abort"` the unwinder only
//!    walks stacks for backtraces. The idle daemon maps 84 KiB less
//!    (docs/benchmarks.md, "every target, side by side"). `libm.so` stays:
//!    glibc's `libm.a` resolves its ifuncs through the dynamic loader's private
//!    symbols, so it cannot be linked into a dynamic program.

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
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let Some(eh) = archive(&cc, "libgcc_eh.a") else { return };
    // The static unwinder, for every binary (points 2 and 4 above): the
    // one library in this directory is `libgcc_eh.a` as `libgcc_s.a`.
    let unwinder = out_dir.join("unwinder-libs");
    let _ = std::fs::remove_dir_all(&unwinder);
    if std::fs::create_dir_all(&unwinder).is_err() || !link_as(&unwinder, "libgcc_s.a", &eh) {
        return;
    }
    println!("cargo::rerun-if-env-changed=TUIXIU_DYNAMIC_LAUNCHER");
    let dynamic_launcher = std::env::var_os("TUIXIU_DYNAMIC_LAUNCHER").is_some_and(|v| v != "0");
    for bin in ["tuixiu-sandbox-full", "tuixiu-sandbox-proxy"]
        .into_iter()
        .chain((!dynamic_launcher).then_some("tuixiu-sandbox"))
    {
        println!("cargo::rustc-link-arg-bin={bin}=-L{}", unwinder.display());
    }
    if dynamic_launcher {
        return;
    }
    // glibc's static archives, for the binaries linked as a static PIE.
    let dir = out_dir.join("glibc-libs");
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let glibc: Option<Vec<_>> =
        GLIBC_ARCHIVES.iter().map(|name| Some((*name, archive(&cc, name)?))).collect();
    let static_pie = glibc.is_some_and(|archives| {
        supports_static_pie(&cc, &out_dir) && {
            let linked = archives.iter().all(|(name, path)| link_as(&dir, name, path));
            if !linked {
                // Never half of it: glibc's archives without -static-pie
                // make a binary that crashes at start.
                for (name, _) in &archives {
                    let _ = std::fs::remove_file(dir.join(name));
                }
            }
            linked
        }
    });
    println!("cargo::rerun-if-env-changed=TUIXIU_STATIC");
    let all = std::env::var_os("TUIXIU_STATIC").is_some_and(|v| v != "0");
    if all && !static_pie {
        println!(
            "cargo::warning=TUIXIU_STATIC=1: this toolchain cannot link a static PIE; the binaries stay dynamic"
        );
    }
    let bins: &[&str] = if all {
        &["tuixiu-sandbox", "tuixiu-sandbox-full", "tuixiu-sandbox-proxy"]
    } else {
        &["tuixiu-sandbox"]
    };
    if !static_pie {
        return;
    }
    for bin in bins {
        println!("cargo::rustc-link-arg-bin={bin}=-L{}", dir.display());
        println!("cargo::rustc-link-arg-bin={bin}=-static-pie");
        // What rustc's crt-static adds after the libraries: static libc
        // may call into libgcc and the unwinder, in either order.
        for arg in ["-Wl,--start-group", "-lgcc_eh", "-lgcc", "-lc", "-Wl,--end-group"] {
            println!("cargo::rustc-link-arg-bin={bin}={arg}");
        }
    }
}

/// The libraries Rust's standard library asks for by name on linux-gnu.
const GLIBC_ARCHIVES: [&str; 6] = ["libc.a", "libm.a", "libpthread.a", "librt.a", "libdl.a", "libutil.a"];

/// The absolute path of a static archive `cc` would link, if it has one.
fn archive(cc: &str, name: &str) -> Option<PathBuf> {
    let out = Command::new(cc).arg(format!("-print-file-name={name}")).output().ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && path.is_absolute() && path.is_file()).then_some(path)
}

/// `dir/name` as a symlink to `target`.
fn link_as(dir: &std::path::Path, name: &str, target: &std::path::Path) -> bool {
    std::os::unix::fs::symlink(target, dir.join(name)).is_ok()
}

/// Whether `cc` links and runs a static PIE.
fn supports_static_pie(cc: &str, out_dir: &std::path::Path) -> bool {
    let src = out_dir.join("static-pie-probe.c");
    let bin = out_dir.join("static-pie-probe");
    if std::fs::write(&src, "#include <stdio.h>\nint main(void) { return puts(\"\") == EOF; }\n").is_err() {
        return false;
    }
    let Ok(out) = Command::new(cc).arg("-static-pie").arg("-fPIE").arg(&src).arg("-o").arg(&bin).output()
    else {
        return false;
    };
    out.status.success() && Command::new(&bin).output().is_ok_and(|o| o.status.success())
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
