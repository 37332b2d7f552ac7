//! `acp::fs::GuestFs`: path resolution for `fs/read_text_file`,
//! `fs/write_text_file` and a terminal's `cwd`, on a real host tree with
//! symlinks that stay in and symlinks that lead out (`guest_tree`), in
//! both views: a sandbox's whole `/` (first byte even) and the host
//! directories behind docker volumes (odd).
//!
//! The rest of the input is one operation per line, the agent's moves
//! first among them (what an agent can do inside its sandbox: make links,
//! directories and files in the workspace and home), then the calls:
//!   `l PATH TARGET`  symlink     `m PATH`  directory     `f PATH`  file
//!   `r PATH [LINE [LIMIT]]`  read      `w PATH TEXT`  write
//!   `d PATH`  resolve a directory
//!
//! Checked: no panic; a read never returns the secret that lies outside
//! the workspace and home; a resolved directory is inside them; nothing
//! outside them changes, whatever was written.
#![no_main]

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use tuixiu_sandbox::acp::fs::GuestFs;
use tuixiu_sandbox_fuzz::{ALLOWED, guest_tree, outside_allowed};

fuzz_target!(|data: &[u8]| {
    let Some((&view, ops)) = data.split_first() else { return };
    let dir = tuixiu_sandbox_fuzz::scratch();
    let tree = dir.path().join("tree");
    let secret = tuixiu_sandbox_fuzz::marker();
    guest_tree(&tree, &secret);
    let before = outside_allowed(&tree);
    let fs = if view % 2 == 0 {
        GuestFs::tree_root(&tree, ALLOWED).unwrap()
    } else {
        let (ws, home) = (tree.join("workspace"), tree.join("home/agent"));
        GuestFs::host_dirs(&[("/workspace", ws.as_path()), ("/home/agent", home.as_path())], None).unwrap()
    };

    for line in String::from_utf8_lossy(ops).lines().take(64) {
        let mut parts = line.splitn(3, ' ');
        let (op, path, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
        match op {
            "l" => agent_makes(&tree, path, Made::Link(rest.unwrap_or(""))),
            "m" => agent_makes(&tree, path, Made::Dir),
            "f" => agent_makes(&tree, path, Made::File),
            "r" => {
                let mut nums = rest.unwrap_or("").split(' ').map(|n| n.parse::<u64>().ok());
                let (line, limit) = (nums.next().flatten(), nums.next().flatten());
                if let Ok(text) = fs.read(path, line, limit, 1 << 20) {
                    assert!(!text.contains(&secret), "read {path:?} returned the secret");
                }
            }
            "w" => {
                let _ = fs.write(path, rest.unwrap_or(""));
            }
            "d" => {
                if let Ok(dir) = fs.open_dir(path) {
                    let g = dir.guest.to_string_lossy();
                    assert!(
                        ALLOWED.iter().any(|a| sandbox::guest_path::is_within(&g, a)),
                        "open_dir({path:?}) = {g:?}, outside the workspace and home"
                    );
                }
            }
            _ => {}
        }
    }
    assert_eq!(outside_allowed(&tree), before, "something outside the workspace and home changed");
});

enum Made<'a> {
    Link(&'a str),
    Dir,
    File,
}

/// What the agent itself could make at guest `path` (inside the workspace
/// or home), made on the host without following any symlink on the way.
fn agent_makes(tree: &Path, path: &str, what: Made<'_>) {
    let Ok(norm) = sandbox::guest_path::normalize(path) else { return };
    if !ALLOWED.iter().any(|a| sandbox::guest_path::is_within(&norm, a)) || ALLOWED.contains(&norm.as_str()) {
        return;
    }
    let comps: Vec<&str> = norm.split('/').filter(|c| !c.is_empty()).collect();
    let Some((last, parents)) = comps.split_last() else { return };
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let Ok(mut dir): Result<OwnedFd, _> = nix::fcntl::open(tree, flags, Mode::empty()) else { return };
    for c in parents {
        let Ok(name) = CString::new(*c) else { return };
        match openat(dir.as_fd(), name.as_c_str(), flags, Mode::empty()) {
            Ok(fd) => dir = fd,
            Err(_) => return,
        }
    }
    let Ok(name) = CString::new(*last) else { return };
    let _ = match what {
        Made::Link(target) => nix::unistd::symlinkat(target, dir.as_fd(), name.as_c_str()).map(drop),
        Made::Dir => mkdirat(dir.as_fd(), name.as_c_str(), Mode::from_bits_truncate(0o755)),
        Made::File => openat(
            dir.as_fd(),
            name.as_c_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map(drop),
    };
}
