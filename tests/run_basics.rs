//! Placeholder removed once the foundation tests land.
mod common;

#[test]
fn help_exits_zero() {
    let out = std::process::Command::new(common::binary()).args(["run", "--help"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--workspace"));
}
