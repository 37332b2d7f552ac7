//! The portal's request, as the launcher's worker reads it from inside a
//! sandbox: JSON into `sandbox::nested::Request`, then
//! `Request::check_served`, every check made before anything is touched.
//!
//! The input's first byte is how many descriptors came with the request
//! (low four bits) and whether the sandbox user is host root (bit 4); the
//! rest is the JSON body.
//!
//! Checked: nothing panics; a refusal is one line; a request that passes
//! asks for nothing a nested sandbox may not have: no set-uid or set-gid
//! mode for PID 1's own steps, none of the options only the host serves
//! (`--userns2` and the rest), capabilities only with its own user
//! namespace, no destination outside the new root, descriptors as many as
//! came and each named once, and (for a root sandbox user) no overlay
//! writing to a host directory; and it goes back to JSON unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox::nested::{Op, OverlayKind, Request, request};
use tuixiu_sandbox_fuzz::assert_one_line;

fuzz_target!(|input: &[u8]| {
    let Some((&flags, body)) = input.split_first() else { return };
    let received = usize::from(flags & 0x0f);
    let root = flags & 0x10 != 0;
    let Ok(req) = serde_json::from_slice::<Request>(body) else { return };
    match req.check_served(received, root) {
        Err(e) => assert_one_line("refusal", &e.to_string()),
        Ok(()) => {
            assert!(req.userns2_fd.is_none() && req.host_only.is_empty(), "{req:?}");
            for op in &req.ops {
                let mode = match op {
                    Op::Chmod { mode, .. } | Op::Tmpfs { mode, .. } | Op::Dir { mode, .. } | Op::Data { mode, .. } => {
                        *mode
                    }
                    _ => 0,
                };
                assert_eq!(mode & 0o6000, 0, "{op:?}");
                assert!(request::dest(op.dst()).is_ok(), "{op:?}");
                if root {
                    assert!(!matches!(op, Op::Overlay { kind: OverlayKind::Rw { .. }, .. }), "{op:?}");
                }
            }
            if !req.unshare.user {
                assert!(req.caps.is_none_or(|c| c == 0), "{req:?}");
            }
            assert_eq!(req.fds.len(), received);
            let mut fds = req.fds.clone();
            fds.sort_unstable();
            fds.dedup();
            assert_eq!(fds.len(), received);
            let again: Request = serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
            assert_eq!(again, req);
        }
    }
});
