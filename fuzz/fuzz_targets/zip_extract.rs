//! The safe zip extractor (`inputs::zip::extract`), on archives read as
//! they are (first byte even) or built from a list of entries (odd: names,
//! kinds, modes, methods and contents from the input, so the checksums
//! are right and the checks past the central directory are reached).
//!
//! Checked for every input: no panic; errors are one line; nothing is
//! written outside the extraction directory (its parent and a sibling are
//! compared before and after); what was extracted is only directories and
//! regular files within the limits, and an `Ok` counts them exactly; the
//! heap grows by a bounded amount whatever the archive declares.
#![no_main]

use std::fs::File;
use std::io::{Cursor, Seek, Write};
use std::os::fd::{AsFd, FromRawFd};

use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::inputs::zip::{ZipLimits, extract};
use tuixiu_sandbox_fuzz::{Counting, Node, Snapshot, assert_one_line};
use zip::write::SimpleFileOptions;

#[global_allocator]
static ALLOC: Counting = Counting;

const LIMITS: ZipLimits = ZipLimits { max_entries: 64, max_file_bytes: 1 << 20, max_total_bytes: 4 << 20 };

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let archive = if mode % 2 == 0 { rest.to_vec() } else { build(rest) };

    let dir = tuixiu_sandbox_fuzz::scratch();
    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    std::fs::create_dir(dir.path().join("sibling")).unwrap();
    std::fs::write(dir.path().join("sibling/keep"), "keep").unwrap();
    let before = Snapshot::take(dir.path(), &["into"]);

    let file = memfd(&archive);
    let root = nix::fcntl::open(
        &into,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();

    let base = Counting::current();
    Counting::reset();
    let result = extract(&file, root.as_fd(), &LIMITS);
    let grown = Counting::peak().saturating_sub(base);
    // Buffers (256 KiB copy, 64 KiB reader, inflate state) and the central
    // directory, which cannot be larger than the archive.
    let bound = (8 << 20) + 16 * archive.len();
    assert!(grown <= bound, "extraction grew the heap by {grown} bytes (bound {bound})");

    assert_eq!(Snapshot::take(dir.path(), &["into"]), before, "something outside the extraction changed");
    let tree = Snapshot::take(&into, &[]);
    let (mut files, mut bytes) = (0u64, 0u64);
    for (path, node) in &tree.0 {
        match node {
            Node::Dir { .. } => {}
            Node::File { content, mode } => {
                files += 1;
                bytes += content.len() as u64;
                assert!(content.len() as u64 <= LIMITS.max_file_bytes, "{} is too large", path.display());
                assert_eq!(mode & 0o7000, 0, "{} has special mode bits {mode:o}", path.display());
            }
            other => panic!("{} was extracted as {other:?}", path.display()),
        }
    }
    assert!(files <= LIMITS.max_entries, "{files} files");
    assert!(bytes <= LIMITS.max_total_bytes, "{bytes} bytes");
    match result {
        Ok(out) => {
            assert_eq!((out.files, out.bytes), (files, bytes), "the count differs from the tree");
        }
        Err(e) => assert_one_line("zip error", &e.to_string()),
    }
});

fn memfd(bytes: &[u8]) -> File {
    // SAFETY: a constant, NUL-terminated name; the flags are valid.
    let fd = unsafe { libc::memfd_create(c"archive".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nobody else.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).unwrap();
    file.rewind().unwrap();
    file
}

/// Reads entries from `data` and writes them as a zip. Each entry: a kind
/// byte, a name (length byte + bytes), then for files a content spec (a
/// length byte + bytes, or a repeated byte for large, compressible files).
fn build(mut data: &[u8]) -> Vec<u8> {
    let mut take = |n: usize| -> &[u8] {
        let n = n.min(data.len());
        let (head, tail) = data.split_at(n);
        data = tail;
        head
    };
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for _ in 0..80 {
        let [kind] = take(1) else { break };
        let kind = *kind;
        let len = take(1).first().copied().unwrap_or(0) as usize;
        let name = String::from_utf8_lossy(take(len % 64)).into_owned();
        let method =
            if kind & 0x10 != 0 { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
        let perms = match (kind >> 5) & 3 {
            0 => 0o644,
            1 => 0o755,
            2 => 0o4755,
            _ => 0o1777,
        };
        let opts = SimpleFileOptions::default().compression_method(method).unix_permissions(perms);
        let ok = match kind % 4 {
            0 | 1 => {
                let spec = take(2);
                let content: Vec<u8> = match spec {
                    [n, b] if n & 0x80 != 0 => vec![*b; usize::from(n & 0x7f) * 32 * 1024],
                    [n, _] => take(usize::from(*n)).to_vec(),
                    _ => Vec::new(),
                };
                w.start_file(name, opts).is_ok() && w.write_all(&content).is_ok()
            }
            2 => w.add_directory(name, opts).is_ok(),
            _ => {
                let tlen = take(1).first().copied().unwrap_or(0) as usize;
                let target = String::from_utf8_lossy(take(tlen % 64)).into_owned();
                w.add_symlink(name, target, opts).is_ok()
            }
        };
        if !ok {
            break;
        }
    }
    w.finish().map(Cursor::into_inner).unwrap_or_default()
}
