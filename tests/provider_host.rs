//! The host provider: no isolation, so it must be asked for explicitly,
//! warn every time, and still build the environment explicitly.

mod common;

use std::time::Duration;

use common::{Caller, Fixture, stderr};
use tokio::io::{AsyncBufReadExt, BufReader};
use tuixiu_sandbox::provider::host::HostProvider;
use tuixiu_sandbox::provider::{InstanceConfig, InstanceStatus, ProcessSpec, Provider, ProviderError};

#[test]
fn refused_unless_acknowledged() {
    let fixture = Fixture::new(Caller::Root);
    let state = fixture.dir.join("state").display().to_string();
    let out =
        fixture.run(&["--provider", "host", "--state-dir", &state], &["touch", "/tmp/should-not-exist-host"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("--i-know-there-is-no-isolation"), "{}", stderr(&out));
    assert!(!std::path::Path::new("/tmp/should-not-exist-host").exists());
    assert!(!fixture.dir.join("state").exists(), "nothing is written before the acknowledgement");
}

#[test]
fn runs_in_the_workspace_with_an_explicit_environment_and_warns() {
    let fixture = Fixture::new(Caller::Root);
    let state = fixture.dir.join("state").display().to_string();
    let extra = ["--provider", "host", "--i-know-there-is-no-isolation", "--state-dir", state.as_str()];
    let out = fixture.run(&extra, &["sh", "-c", "pwd; echo \"$HOME\"; env | sort; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("WITHOUT ANY ISOLATION"), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let ws = std::fs::canonicalize(&fixture.workspace).unwrap();
    assert!(stdout.starts_with(&format!("{}\n{state}/host/default-home\n", ws.display())), "{stdout}");
    assert!(!stdout.contains(common::LEAK_MARKER.1), "the caller's environment leaked: {stdout}");
    assert!(stdout.contains("USER=agent\n"), "{stdout}");

    assert_eq!(fixture.run(&extra, &["no-such-command"]).status.code(), Some(127));
    let out = fixture.run(&[&extra[..], &["--chdir", "/etc"]].concat(), &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("must be under /workspace"), "{}", stderr(&out));
    let out = fixture.run(&[&extra[..], &["--network", "off"]].concat(), &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("cannot honour --network off"), "{}", stderr(&out));
}

#[tokio::test]
async fn instances_report_host_process_and_kills_reach_the_group() {
    let fixture = Fixture::new(Caller::Root);
    let p = HostProvider::new(&fixture.dir.join("state"), "tuixiu-run-", true).unwrap();
    let name = "tuixiu-run-host";
    let info = p.ensure(&InstanceConfig::new(name, "host", &fixture.workspace)).await.unwrap();
    assert_eq!(info.provider, "host_process");
    assert_eq!(info.status, InstanceStatus::Running);

    // A shell with a background child: SIGTERM reaches both.
    let spec = ProcessSpec::new(["sh", "-c", "sleep 60 & echo $!; wait"]);
    let mut proc = p.exec(name, &spec).await.unwrap();
    let mut lines = BufReader::new(proc.stdout.take().unwrap()).lines();
    let child: i32 = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    proc.killer().kill(libc::SIGTERM).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), proc.wait()).await.unwrap().unwrap();
    assert_eq!(status.signal, Some(libc::SIGTERM));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z "), "the background child survived: {stat}");

    let unacknowledged = HostProvider::new(&fixture.dir.join("state"), "tuixiu-run-", false).unwrap();
    let err = unacknowledged.exec(name, &ProcessSpec::new(["true"])).await.err().unwrap();
    assert!(matches!(err, ProviderError::HostNotAcknowledged), "{err}");
    // ... but it may still list and remove.
    assert_eq!(unacknowledged.list().await.unwrap().len(), 1);
    assert_eq!(unacknowledged.remove(name).await.unwrap().status, InstanceStatus::Missing);
}
