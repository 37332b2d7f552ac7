//! bubblewrap's command line (`bwrap::parse::parse`), as the front end
//! gets it on the host and inside a sandbox.
//!
//! The input is the arguments after `argv[0]`, separated by NUL bytes, then
//! optionally a 0xFF byte and the data every descriptor read returns
//! (`--args FD`, `--add-seccomp-fd FD`). Arguments are made UTF-8 (lossy)
//! as the front end refuses others before parsing.
//!
//! Checked: parsing never panics; every error and warning is one line (the
//! front end prints it after `bwrap: `); a parsed command line has a
//! COMMAND, only known options in `given`, and `--perms`/`--size`/
//! `--overlay-src` never left pending.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::bwrap::options;
use tuixiu_sandbox::bwrap::parse::{self, Io, Outcome};
use tuixiu_sandbox_fuzz::assert_one_line;

struct FuzzIo<'a> {
    data: &'a [u8],
    reads: usize,
}

impl Io for FuzzIo<'_> {
    fn read_fd(&mut self, fd: i32) -> std::io::Result<Vec<u8>> {
        self.reads += 1;
        // A negative or huge number is a bad descriptor, as the kernel says;
        // a recursion through `--args` cannot read the same data forever.
        if !(0..1024).contains(&fd) || self.reads > 16 {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        }
        Ok(self.data.to_vec())
    }

    fn warn(&mut self, message: &str, _prefixed: bool) {
        assert_one_line("warning", message);
    }

    // The first data byte plays SELinux: bit 0 enabled, bit 1 the label
    // valid, bit 2 the file label applied.
    fn selinux(&self) -> bool {
        self.data.first().is_some_and(|b| b & 1 == 1)
    }

    fn check_label(&mut self, _label: &str) -> std::io::Result<()> {
        match self.data.first() {
            Some(b) if b & 2 == 2 => Ok(()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn file_label(&mut self, _label: &str) -> std::io::Result<()> {
        match self.data.first() {
            Some(b) if b & 4 == 4 => Ok(()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EACCES)),
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let (argv, data) = match input.iter().position(|&b| b == 0xff) {
        Some(at) => (&input[..at], &input[at + 1..]),
        None => (input, &[][..]),
    };
    let args: Vec<String> = if argv.is_empty() {
        Vec::new()
    } else {
        argv.split(|&b| b == 0).take(256).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
    };
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/root".to_string())];
    let mut io = FuzzIo { data, reads: 0 };
    match parse::parse(&args, env, &mut io) {
        Err(e) => {
            assert_one_line("error", &e.message);
            assert!(!e.message.is_empty(), "an empty error for {args:?}");
        }
        Ok(Outcome::Run(parsed)) => {
            assert!(!parsed.command.is_empty(), "a run without COMMAND for {args:?}");
            for name in &parsed.given {
                assert!(options::find(name).is_some(), "{name} given but not an option");
            }
            for name in parsed.host_only() {
                assert!(parsed.given.contains(&name.as_str()), "{name} named but not given");
            }
            let _ = parsed.caps(0);
        }
        Ok(Outcome::Help | Outcome::Version | Outcome::Usage) => {}
    }
});
