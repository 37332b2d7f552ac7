//! Variables that exist only for the tests, which use them to reach code
//! paths a test host would not take by itself (a kernel without Landlock,
//! a filesystem without idmapped mounts). Read only in debug builds (the
//! ones `cargo test` runs): a release binary never looks at them, so that
//! nobody can weaken a production sandbox through its environment
//! (docs/security.md). This file depends on `std` alone: the unit test
//! below compiles it as release and debug programs and runs both.

/// Pretend idmapped mounts are impossible: the masking fallback.
pub const NO_IDMAP: &str = "TUIXIU_SANDBOX_TEST_ONLY_NO_IDMAP";
/// Pretend the kernel reports this Landlock ABI (0 = none).
pub const LANDLOCK_ABI: &str = "TUIXIU_SANDBOX_TEST_ONLY_LANDLOCK_ABI";

/// The variable `name` (one of the above), in a debug build.
#[cfg(debug_assertions)]
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// A release build reads none of them.
#[cfg(not(debug_assertions))]
pub fn var(_name: &str) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    /// This file as a program that prints what `var` returns for each
    /// variable, built with `rustc` with and without debug assertions
    /// (`-O` as cargo's release profile), run with both variables set.
    #[test]
    fn a_release_build_ignores_the_variables() {
        let dir = std::env::temp_dir().join(format!("tuixiu-test-only-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let main = dir.join("main.rs");
        let this = concat!(env!("CARGO_MANIFEST_DIR"), "/src/test_only.rs");
        std::fs::write(
            &main,
            format!(
                "#[path = {this:?}] mod test_only;\n\
                 fn main() {{ for v in [test_only::NO_IDMAP, test_only::LANDLOCK_ABI] {{ \
                 println!(\"{{v}}={{:?}}\", test_only::var(v)); }} }}\n"
            ),
        )
        .unwrap();
        let run = |release: bool| {
            let exe = dir.join(if release { "release" } else { "debug" });
            let mut rustc = std::process::Command::new("rustc");
            rustc.args(["--edition", "2024", "-o"]).arg(&exe).arg(&main);
            if release {
                rustc.args(["-C", "opt-level=3", "-C", "debug-assertions=off"]);
            } else {
                rustc.args(["-C", "debug-assertions=on"]);
            }
            let built = rustc.output().unwrap();
            assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
            let out = std::process::Command::new(&exe)
                .env(super::NO_IDMAP, "1")
                .env(super::LANDLOCK_ABI, "0")
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        let debug = run(false);
        assert_eq!(
            debug,
            "TUIXIU_SANDBOX_TEST_ONLY_NO_IDMAP=Some(\"1\")\nTUIXIU_SANDBOX_TEST_ONLY_LANDLOCK_ABI=Some(\"0\")\n"
        );
        let release = run(true);
        assert_eq!(
            release,
            "TUIXIU_SANDBOX_TEST_ONLY_NO_IDMAP=None\nTUIXIU_SANDBOX_TEST_ONLY_LANDLOCK_ABI=None\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
