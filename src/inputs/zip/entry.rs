//! One entry's data: read, inflated, counted and checked, written.
//!
//! The zip crate parses the headers and hands over the raw (compressed)
//! bytes of an entry; inflating them here instead of through its reader
//! stack means large reads of the archive (its reader refills 8 KiB at a
//! time), output in large chunks, and `Z_FINISH` once the whole entry is
//! in the input buffer, which spares zlib-rs its sliding-window copy for
//! every entry that fits. The checks are the extractor's: the entry never
//! yields more than one byte past its declared size before it is refused,
//! fewer bytes than declared is refused too, and the CRC-32 from the
//! central directory must match.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};

use flate2::{Decompress, FlushDecompress, Status};

use super::{Entry, ZipError, fsx};

/// Compressed bytes read at a time.
const IN_BUF: usize = 128 * 1024;
/// Inflated bytes written at a time (a 44 KiB file is one `write`).
pub(super) const OUT_BUF: usize = 256 * 1024;
/// What the archive reader keeps of the file (central directory and local
/// headers are read in small pieces).
const READ_AHEAD: usize = 16 * 1024;

/// The archive read by position (`pread`), so that every worker has its
/// own offset on the one descriptor. Small reads are served from a buffer
/// that a seek does not discard.
pub(super) struct ArchiveAt<'a> {
    file: &'a File,
    pos: u64,
    buf: Box<[u8]>,
    /// File offset of `buf[0]` and how much of `buf` is valid.
    buf_at: u64,
    buf_len: usize,
}

impl<'a> ArchiveAt<'a> {
    pub(super) fn new(file: &'a File) -> ArchiveAt<'a> {
        ArchiveAt { file, pos: 0, buf: vec![0; READ_AHEAD].into_boxed_slice(), buf_at: 0, buf_len: 0 }
    }
}

impl Clone for ArchiveAt<'_> {
    fn clone(&self) -> Self {
        ArchiveAt::new(self.file)
    }
}

impl Read for ArchiveAt<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let in_buf = self.pos.checked_sub(self.buf_at).filter(|&o| o < self.buf_len as u64);
        let n = match in_buf {
            Some(offset) => {
                let have = &self.buf[offset as usize..self.buf_len];
                let n = have.len().min(out.len());
                out[..n].copy_from_slice(&have[..n]);
                n
            }
            None if out.len() >= self.buf.len() => self.file.read_at(out, self.pos)?,
            None => {
                self.buf_len = self.file.read_at(&mut self.buf, self.pos)?;
                self.buf_at = self.pos;
                let n = self.buf_len.min(out.len());
                out[..n].copy_from_slice(&self.buf[..n]);
                n
            }
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ArchiveAt<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek out of range");
        self.pos = match to {
            SeekFrom::Start(n) => n,
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).ok_or_else(invalid)?,
            SeekFrom::End(d) => self.file.metadata()?.len().checked_add_signed(d).ok_or_else(invalid)?,
        };
        Ok(self.pos)
    }
}

/// A worker's buffers and inflate state, reused from entry to entry.
pub(super) struct Scratch {
    input: Vec<u8>,
    output: Vec<u8>,
    inflate: Decompress,
}

impl Scratch {
    pub(super) fn new() -> Scratch {
        Scratch { input: vec![0; IN_BUF], output: vec![0; OUT_BUF], inflate: Decompress::new(false) }
    }
}

/// Why an entry's extraction ended early.
pub(super) enum Failed {
    /// The entry is bad, or writing it failed.
    Error(ZipError),
    /// An earlier entry failed; this one no longer matters.
    Stopped,
}

impl From<ZipError> for Failed {
    fn from(e: ZipError) -> Self {
        Failed::Error(e)
    }
}

/// Fills `file` with the data of `entry`; returns the byte count. `stop`
/// holds the position of the earliest failed entry (`usize::MAX` while
/// none failed): once it is below `position`, this entry is abandoned.
pub(super) fn write_entry(
    zip: &mut ::zip::ZipArchive<ArchiveAt<'_>>,
    entry: &Entry,
    position: usize,
    file: &mut File,
    s: &mut Scratch,
    stop: &AtomicUsize,
) -> Result<u64, Failed> {
    let corrupt =
        |e: &dyn std::fmt::Display| ZipError::Invalid(format!("zip entry corrupt: {}: {e}", entry.shown));
    let mut raw = zip
        .by_index_raw(entry.index)
        .map_err(|e| ZipError::Invalid(format!("zip entry unreadable: {}: {e}", entry.shown)))?;
    let stored = raw.compression() == ::zip::CompressionMethod::Stored;
    let expected_crc = raw.crc32();
    let mut crc = crc32fast::Hasher::new();
    let mut produced: u64 = 0;
    let mut filled = 0usize;
    let (mut start, mut end, mut input_done) = (0usize, 0usize, false);
    s.inflate.reset(false);
    loop {
        if stop.load(Ordering::Relaxed) < position {
            return Err(Failed::Stopped);
        }
        if filled == s.output.len() {
            flush(file, &s.output[..filled], &mut crc, entry)?;
            filled = 0;
        }
        if start == end && !input_done {
            end = read_full(&mut raw, &mut s.input).map_err(|e| corrupt(&e))?;
            start = 0;
            input_done = end < s.input.len();
        }
        // Never room for more than one byte past the declared size: a
        // header that lies is caught there, whatever the data holds.
        let room = (entry.size - produced).saturating_add(1).min((s.output.len() - filled) as u64) as usize;
        let out = &mut s.output[filled..filled + room];
        let inflate = (!stored).then_some(&mut s.inflate);
        let (consumed, made, ended) =
            advance(inflate, &s.input[start..end], out, input_done).map_err(|e| corrupt(&e))?;
        start += consumed;
        filled += made;
        produced += made as u64;
        if produced > entry.size {
            return Err(size_lie(entry).into());
        }
        if ended {
            break;
        }
        if consumed == 0 && made == 0 {
            if input_done && start == end {
                // The raw data ends before the deflate stream does: what
                // came out is checked against the size and CRC below (as
                // the zip crate's reader does).
                break;
            }
            if start < end {
                // Input and room, and nothing moved.
                return Err(corrupt(&"the deflate stream does not advance").into());
            }
        }
    }
    flush(file, &s.output[..filled], &mut crc, entry)?;
    if produced != entry.size {
        return Err(ZipError::Unsafe(format!(
            "zip entry size mismatch: {} declared={} actual={produced}",
            entry.shown, entry.size
        ))
        .into());
    }
    if crc.finalize() != expected_crc {
        return Err(corrupt(&"Invalid checksum").into());
    }
    Ok(produced)
}

/// Moves an entry's data from `input` into `out`: copied when stored,
/// else through `inflate` (`input_done`: no more input follows). Returns
/// the input consumed, the output made, and whether the data ended.
fn advance(
    inflate: Option<&mut Decompress>,
    input: &[u8],
    out: &mut [u8],
    input_done: bool,
) -> Result<(usize, usize, bool), flate2::DecompressError> {
    let Some(inflate) = inflate else {
        let n = input.len().min(out.len());
        out[..n].copy_from_slice(&input[..n]);
        return Ok((n, n, input_done && n == input.len()));
    };
    let (in_before, out_before) = (inflate.total_in(), inflate.total_out());
    let how = if input_done { FlushDecompress::Finish } else { FlushDecompress::None };
    let status = inflate.decompress(input, out, how)?;
    let consumed = (inflate.total_in() - in_before) as usize;
    let made = (inflate.total_out() - out_before) as usize;
    Ok((consumed, made, status == Status::StreamEnd))
}

pub(super) fn size_lie(entry: &Entry) -> ZipError {
    ZipError::Unsafe(format!(
        "zip entry size mismatch: {} declared={} actual>{}",
        entry.shown, entry.size, entry.size
    ))
}

fn flush(file: &mut File, bytes: &[u8], crc: &mut crc32fast::Hasher, entry: &Entry) -> Result<(), ZipError> {
    crc.update(bytes);
    file.write_all(bytes)
        .map_err(|e| ZipError::Fs(fsx::fs_err("write", &entry.path, crate::hostfs::errno_of(&e))))
}

/// Reads until `buf` is full or the entry's raw data ends.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
