//! Name resolution for the proxy: the system's resolver (`getaddrinfo`, on
//! tokio's blocking pool), called by the proxy for every connection. The
//! sandbox itself has no DNS.
//!
//! Test builds (`debug_assertions`) honour one more source, so that
//! integration tests can give names to loopback servers: a hosts-file
//! style mapping named by [`TEST_HOSTS_ENV`] (`ADDRESS NAME...` per line),
//! which, when set, is the only source. Release builds compile it out: the
//! variable means nothing there.

use std::io;
use std::net::SocketAddr;

/// The test builds' mapping (see the module's documentation).
pub const TEST_HOSTS_ENV: &str = "TUIXIU_SANDBOX_TEST_ONLY_EGRESS_HOSTS";

/// Resolves names to addresses.
#[derive(Clone, Debug, Default)]
pub struct Resolver {
    #[cfg(debug_assertions)]
    test_hosts: Option<std::sync::Arc<Vec<(String, std::net::IpAddr)>>>,
}

impl Resolver {
    /// The system's resolver (and, in a test build, the mapping the
    /// environment names, read now).
    pub fn from_env() -> io::Result<Resolver> {
        #[cfg(debug_assertions)]
        return Resolver::with_test_hosts(std::env::var_os(TEST_HOSTS_ENV).as_deref());
        #[cfg(not(debug_assertions))]
        Ok(Resolver::default())
    }

    /// The system's resolver; a test build reads `mapping` (a hosts-file
    /// style file), a release build ignores it.
    pub fn with_test_hosts(mapping: Option<&std::ffi::OsStr>) -> io::Result<Resolver> {
        #[cfg(debug_assertions)]
        if let Some(path) = mapping {
            let text = std::fs::read_to_string(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.to_string_lossy())))?;
            let mut hosts = Vec::new();
            for line in text.lines() {
                let mut words = line.split('#').next().unwrap_or("").split_whitespace();
                let Some(addr) = words.next() else { continue };
                let addr: std::net::IpAddr =
                    addr.parse().map_err(|_| io::Error::other(format!("{TEST_HOSTS_ENV}: {line:?}")))?;
                hosts.extend(words.map(|name| (name.to_ascii_lowercase(), addr)));
            }
            return Ok(Resolver { test_hosts: Some(std::sync::Arc::new(hosts)) });
        }
        #[cfg(not(debug_assertions))]
        let _ = mapping;
        Ok(Resolver::default())
    }

    /// Every address of `name`, in the resolver's order.
    pub async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        #[cfg(debug_assertions)]
        if let Some(hosts) = &self.test_hosts {
            let found: Vec<SocketAddr> =
                hosts.iter().filter(|(n, _)| n == name).map(|(_, ip)| SocketAddr::new(*ip, port)).collect();
            return match found.is_empty() {
                true => Err(io::Error::new(io::ErrorKind::NotFound, "no such name")),
                false => Ok(found),
            };
        }
        let found: Vec<SocketAddr> = tokio::net::lookup_host((name, port)).await?.collect();
        if found.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no address"));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Test builds read the mapping; a release build (`cargo test
    /// --release`) must resolve the same name with the system's resolver
    /// only, which does not know it (`.test` is reserved).
    #[tokio::test]
    async fn only_test_builds_read_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.9 only-in-the-mapping.test\n").unwrap();
        let resolver = Resolver::with_test_hosts(Some(path.as_os_str())).unwrap();
        let found = resolver.resolve("only-in-the-mapping.test", 443).await;
        if cfg!(debug_assertions) {
            assert_eq!(found.unwrap(), ["127.0.0.9:443".parse().unwrap()]);
        } else {
            assert!(found.is_err(), "a release build used the test mapping: {found:?}");
        }
    }
}
