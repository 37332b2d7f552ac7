//! Where a sandbox's nested-sandbox portal lives inside it, and its socket
//! (served by [`crate::nested`]; set up by the plan, [`crate::prepare`]).

use std::os::fd::OwnedFd;

use crate::error::SpecError;

/// The portal's directory inside every sandbox with nested sandboxes on:
/// a small read-only tmpfs of its own.
pub const PORTAL_DIR: &str = "/run/tuixiu";
/// The socket's name in [`PORTAL_DIR`].
pub const SOCKET_NAME: &str = "nested.sock";
/// The socket the front end connects to.
pub const SOCKET: &str = "/run/tuixiu/nested.sock";
/// The front end, bound read-only; its directory is first on `PATH`.
pub const PORTAL_BIN: &str = "/run/tuixiu/bin/bwrap";

/// The portal's socket, made before the sandbox exists; its child binds it
/// inside the new root and listens, the launcher accepts on it.
pub(crate) fn socket() -> Result<OwnedFd, SpecError> {
    crate::sys::unix_stream_socket()
        .map_err(|e| SpecError::new(format!("create the nested-sandbox socket: socket(AF_UNIX) => {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_socket_is_in_the_portal_directory() {
        assert_eq!(super::SOCKET, format!("{}/{}", super::PORTAL_DIR, super::SOCKET_NAME));
    }
}
