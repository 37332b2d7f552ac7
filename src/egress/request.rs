//! What a client inside the sandbox asks the proxy for, parsed strictly and
//! with bounds: an HTTP request head (`CONNECT host:port`, or a request
//! with an absolute `http://` URI), or a SOCKS5 greeting and request. Pure
//! functions over bytes (the fuzz target `egress_request` drives them);
//! nothing here does I/O.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header lines in a head.
pub const MAX_HEADERS: usize = 100;

/// A destination host: a name the proxy resolves, or an address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lower case, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// A host name or an IP address literal (IPv6 without brackets). A
    /// name is ASCII letters, digits, `-` and `_` in labels of 1 to 63
    /// bytes, at most 253 bytes in all; the last label may not start with
    /// a digit, which rules out the numeric forms (`127.1`, `0x7f.1`,
    /// `2130706433`) that resolvers would read as addresses.
    pub fn parse(text: &str) -> Result<Host, &'static str> {
        if let Ok(v4) = text.parse::<Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(v4)));
        }
        if text.contains(':') {
            return text
                .parse::<Ipv6Addr>()
                .map(|v6| Host::Ip(IpAddr::V6(v6)))
                .map_err(|_| "a bad IPv6 address");
        }
        let name = text.strip_suffix('.').unwrap_or(text);
        if name.is_empty() {
            return Err("an empty name");
        }
        if name.len() > 253 {
            return Err("a name longer than 253 bytes");
        }
        if !name.is_ascii() {
            return Err("non-ASCII: write an internationalized name in its xn-- form");
        }
        for label in name.split('.') {
            if label.is_empty() {
                return Err("an empty label");
            }
            if label.len() > 63 {
                return Err("a label longer than 63 bytes");
            }
            if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err("a character a host name cannot have");
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err("a label starting or ending with '-'");
            }
        }
        if name.rsplit('.').next().is_some_and(|last| last.as_bytes()[0].is_ascii_digit()) {
            return Err("an address in a form other than a.b.c.d");
        }
        Ok(Host::Name(name.to_ascii_lowercase()))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Where a client wants to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Target {
    /// `host:port` or `[v6]:port`; `default_port` when the port is left
    /// out (none: the port is required).
    pub fn parse_authority(text: &str, default_port: Option<u16>) -> Result<Target, RequestError> {
        if text.contains('@') {
            return Err(RequestError::Credentials);
        }
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (inside, after) = rest.split_once(']').ok_or(RequestError::Authority)?;
                if !inside.contains(':') {
                    return Err(RequestError::Authority);
                }
                match after {
                    "" => (inside, None),
                    p => (inside, Some(p.strip_prefix(':').ok_or(RequestError::Authority)?)),
                }
            }
            None => match text.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return Err(RequestError::Authority),
                None => (text, None),
            },
        };
        let port = match (port, default_port) {
            (Some(p), _) => parse_port(p).ok_or(RequestError::Authority)?,
            (None, Some(d)) => d,
            (None, None) => return Err(RequestError::Authority),
        };
        let host = Host::parse(host).map_err(RequestError::Host)?;
        Ok(Target { host, port })
    }
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|&n| n > 0)
}

/// Why a request was refused as malformed; the text goes back to the
/// client in the 400 answer (it never quotes the request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the request head is larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("more than {MAX_HEADERS} header lines")]
    TooManyHeaders,
    #[error("a malformed request line")]
    RequestLine,
    #[error("only HTTP/1.0 and HTTP/1.1 are spoken")]
    Version,
    #[error("a malformed header line")]
    Header,
    #[error("lines must end with CRLF")]
    LineEnding,
    #[error("a malformed host:port")]
    Authority,
    #[error("the host is {0}")]
    Host(&'static str),
    #[error("credentials in the URL are not passed on")]
    Credentials,
    #[error("only http:// URLs are forwarded; use CONNECT (HTTPS_PROXY) for https")]
    Scheme,
    #[error("a proxy request needs an absolute http:// URL or CONNECT")]
    NotAbsolute,
}

/// What an HTTP client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `CONNECT host:port`: a tunnel (TLS end to end).
    Connect(Target),
    /// A request for an absolute `http://` URI, passed on in origin form.
    Forward { target: Target, method: String, path: String, http10: bool, headers: Vec<(String, String)> },
}

/// A parsed head and its length in the buffer (what follows is the
/// request's body or a tunnel's first bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub ask: Ask,
    pub len: usize,
}

/// Parses the head at the start of `buf`: `Ok(None)` while it is
/// incomplete (and still within bounds).
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, RequestError> {
    let Some(end) = find(buf, b"\r\n\r\n") else {
        if buf.len() >= MAX_HEAD {
            return Err(RequestError::TooLarge);
        }
        // A bare LF line end is refused as soon as it shows.
        if buf.iter().enumerate().any(|(i, &b)| b == b'\n' && (i == 0 || buf[i - 1] != b'\r')) {
            return Err(RequestError::LineEnding);
        }
        return Ok(None);
    };
    let len = end + 4;
    if len > MAX_HEAD {
        return Err(RequestError::TooLarge);
    }
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| RequestError::Header)?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    if line.bytes().any(|b| b == b'\n' || b == b'\r') {
        return Err(RequestError::LineEnding);
    }
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::RequestLine);
    };
    if method.is_empty() || !method.bytes().all(is_token) || uri.is_empty() {
        return Err(RequestError::RequestLine);
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(RequestError::Version),
    };
    let headers = parse_headers(lines)?;
    let ask = if method == "CONNECT" {
        Ask::Connect(Target::parse_authority(uri, None)?)
    } else {
        let (authority, path) = origin_parts(uri)?;
        Ask::Forward {
            target: Target::parse_authority(authority, Some(80))?,
            method: method.to_string(),
            path,
            http10,
            headers,
        }
    };
    Ok(Some(Head { ask, len }))
}

/// The header lines after the request line, at most [`MAX_HEADERS`].
fn parse_headers<'a>(lines: impl Iterator<Item = &'a str>) -> Result<Vec<(String, String)>, RequestError> {
    let mut headers = Vec::new();
    for line in lines {
        if headers.len() == MAX_HEADERS {
            return Err(RequestError::TooManyHeaders);
        }
        if line.bytes().any(|b| b == b'\n' || b == b'\r') {
            return Err(RequestError::LineEnding);
        }
        let (name, value) = line.split_once(':').ok_or(RequestError::Header)?;
        if name.is_empty() || !name.bytes().all(is_token) {
            return Err(RequestError::Header);
        }
        let value = value.trim_matches([' ', '\t']);
        if value.bytes().any(|b| b == 0 || (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(RequestError::Header);
        }
        headers.push((name.to_string(), value.to_string()));
    }
    Ok(headers)
}

/// An absolute `http://` URI's authority, and its path and query (`/`
/// when it has neither; the fragment is the client's own).
fn origin_parts(uri: &str) -> Result<(&str, String), RequestError> {
    let rest = match uri.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &uri[7..],
        _ if uri.starts_with('/') || uri == "*" => return Err(RequestError::NotAbsolute),
        _ => return Err(RequestError::Scheme),
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    // The fragment is the client's own; what remains is the path and
    // query, `/` when the URI has neither.
    let path = path.split('#').next().unwrap_or("");
    let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
    if path.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(RequestError::RequestLine);
    }
    Ok((authority, path))
}

/// The head a [`Ask::Forward`] is passed on with: origin form, `Host`
/// from the URI, no `Proxy-*` header, one request per connection (unless
/// the client asks for a protocol upgrade, which the same server answers).
pub fn origin_head(
    target: &Target,
    method: &str,
    path: &str,
    http10: bool,
    headers: &[(String, String)],
) -> Vec<u8> {
    let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let host = match (&target.host, target.port) {
        (host, 80) => host.to_string(),
        _ => target.to_string(),
    };
    let upgrade = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("connection") && v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
    });
    let mut out = format!("{method} {path} {version}\r\nHost: {host}\r\n");
    for (name, value) in headers {
        // Every `Proxy-*` header is meant for a proxy (credentials among
        // them), never for the server.
        let lower = name.to_ascii_lowercase();
        let hop = ["host", "connection", "keep-alive"].contains(&lower.as_str())
            || lower.starts_with("proxy-")
            || (!upgrade && lower == "upgrade");
        if !hop {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str(if upgrade { "Connection: upgrade\r\n\r\n" } else { "Connection: close\r\n\r\n" });
    out.into_bytes()
}

fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// SOCKS5's protocol version byte, which also tells a SOCKS5 client from
/// an HTTP one by the first byte.
pub const SOCKS_VERSION: u8 = 5;

/// SOCKS5 reply codes (RFC 1928).
pub mod socks_reply {
    pub const SUCCEEDED: u8 = 0;
    pub const GENERAL_FAILURE: u8 = 1;
    pub const NOT_ALLOWED: u8 = 2;
    pub const HOST_UNREACHABLE: u8 = 4;
    pub const REFUSED: u8 = 5;
    pub const TTL_EXPIRED: u8 = 6;
    pub const COMMAND_NOT_SUPPORTED: u8 = 7;
    pub const ADDRESS_NOT_SUPPORTED: u8 = 8;
}

/// Why a SOCKS5 exchange failed: the reply code to send, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    #[error("not SOCKS version 5")]
    Version,
    #[error("the client offers no method but username/password or GSSAPI; only no-authentication is served")]
    NoMethod,
    #[error("only CONNECT is served (no BIND, no UDP)")]
    Command,
    #[error("an unknown address type")]
    AddressType,
    #[error("the host is {0}")]
    Host(&'static str),
    #[error("a malformed request")]
    Malformed,
}

impl SocksError {
    /// The reply code for a failed request (`None`: no reply, the
    /// exchange never got that far).
    pub fn reply(self) -> Option<u8> {
        match self {
            SocksError::Version | SocksError::NoMethod => None,
            SocksError::Command => Some(socks_reply::COMMAND_NOT_SUPPORTED),
            SocksError::AddressType => Some(socks_reply::ADDRESS_NOT_SUPPORTED),
            SocksError::Host(_) => Some(socks_reply::HOST_UNREACHABLE),
            SocksError::Malformed => Some(socks_reply::GENERAL_FAILURE),
        }
    }
}

/// The greeting (`05 NMETHODS METHODS…`): its length once complete;
/// an error unless no-authentication (method 0) is offered.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<usize>, SocksError> {
    match buf {
        [] => Ok(None),
        [v, ..] if *v != SOCKS_VERSION => Err(SocksError::Version),
        [_] => Ok(None),
        [_, n, methods @ ..] => {
            let n = usize::from(*n);
            if methods.len() < n {
                return Ok(None);
            }
            if methods[..n].contains(&0) { Ok(Some(2 + n)) } else { Err(SocksError::NoMethod) }
        }
    }
}

/// The request (`05 CMD 00 ATYP ADDR PORT`): the target and the request's
/// length once complete.
pub fn parse_socks_request(buf: &[u8]) -> Result<Option<(Target, usize)>, SocksError> {
    if buf.len() < 5 {
        if buf.first().is_some_and(|&v| v != SOCKS_VERSION) {
            return Err(SocksError::Version);
        }
        return Ok(None);
    }
    if buf[0] != SOCKS_VERSION {
        return Err(SocksError::Version);
    }
    if buf[2] != 0 {
        return Err(SocksError::Malformed);
    }
    if buf[1] != 1 {
        return Err(SocksError::Command);
    }
    let (host, at) = match buf[3] {
        1 => match buf.get(4..8) {
            Some(a) => (Host::Ip(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))), 8),
            None => return Ok(None),
        },
        4 => match buf.get(4..20) {
            Some(a) => {
                let bytes: [u8; 16] = a.try_into().expect("16 bytes");
                (Host::Ip(IpAddr::V6(Ipv6Addr::from(bytes))), 20)
            }
            None => return Ok(None),
        },
        3 => {
            let n = usize::from(buf[4]);
            match buf.get(5..5 + n) {
                Some(name) => {
                    let name = std::str::from_utf8(name).map_err(|_| SocksError::Host("not UTF-8"))?;
                    (Host::parse(name).map_err(SocksError::Host)?, 5 + n)
                }
                None => return Ok(None),
            }
        }
        _ => return Err(SocksError::AddressType),
    };
    match buf.get(at..at + 2) {
        Some(p) => {
            let port = u16::from_be_bytes([p[0], p[1]]);
            if port == 0 {
                return Err(SocksError::Malformed);
            }
            Ok(Some((Target { host, port }, at + 2)))
        }
        None => Ok(None),
    }
}

/// A SOCKS5 reply with an unspecified bound address.
pub fn socks_reply(code: u8) -> [u8; 10] {
    [SOCKS_VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Option<Head>, RequestError> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn connect_heads_parse() {
        let h = head("CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\nTLS")
            .unwrap()
            .unwrap();
        assert_eq!(h.ask, Ask::Connect(Target { host: Host::Name("api.openai.com".into()), port: 443 }));
        assert_eq!(h.len, 65);
        let v6 = head("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(v6.ask, Ask::Connect(Target::parse_authority("[2001:db8::1]:8443", None).unwrap()));
        assert_eq!(head("CONNECT a.com HTTP/1.1\r\n\r\n"), Err(RequestError::Authority));
        assert_eq!(head("CONNECT a.com:0 HTTP/1.1\r\n\r\n"), Err(RequestError::Authority));
        assert!(head("CONNECT 127.1:80 HTTP/1.1\r\n\r\n").unwrap_err().to_string().contains("a.b.c.d"));
        assert_eq!(head("CONNECT a.com:443 HTTP/1.1\r\nHost"), Ok(None));
    }

    #[test]
    fn forward_heads_are_rewritten() {
        let h = head("GET http://Example.com:8080/a?b=1#frag HTTP/1.1\r\nHost: evil\r\nProxy-Authorization: x\r\nProxy-Whatever: y\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        let Ask::Forward { target, method, path, http10, headers } = h.ask else { panic!("not a forward") };
        assert_eq!(target.to_string(), "example.com:8080");
        assert_eq!(path, "/a?b=1");
        let out = String::from_utf8(origin_head(&target, &method, &path, http10, &headers)).unwrap();
        assert_eq!(
            out,
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let h = head("GET http://a.com?x HTTP/1.0\r\n\r\n").unwrap().unwrap();
        let Ask::Forward { path, target, .. } = h.ask else { panic!() };
        assert_eq!((path.as_str(), target.port), ("/?x", 80));
        let h = head("GET http://a.com#frag HTTP/1.0\r\n\r\n").unwrap().unwrap();
        let Ask::Forward { path, .. } = h.ask else { panic!() };
        assert_eq!(path, "/");
    }

    #[test]
    fn bad_heads_are_refused() {
        for (text, want) in [
            ("GET /local HTTP/1.1\r\n\r\n", RequestError::NotAbsolute),
            ("GET https://a.com/ HTTP/1.1\r\n\r\n", RequestError::Scheme),
            ("GET http://u:p@a.com/ HTTP/1.1\r\n\r\n", RequestError::Credentials),
            ("GET http://a.com/ HTTP/2\r\n\r\n", RequestError::Version),
            ("GET  http://a.com/ HTTP/1.1\r\n\r\n", RequestError::RequestLine),
            ("GET http://a.com/ HTTP/1.1\r\nBad Header: x\r\n\r\n", RequestError::Header),
            ("GET http://a.com/ HTTP/1.1\r\n folded\r\n\r\n", RequestError::Header),
            ("GET http://a.com/ HTTP/1.1\nX: y\r\n\r\n", RequestError::LineEnding),
            ("GET http://a.com/ HTTP/1.1\n", RequestError::LineEnding),
        ] {
            assert_eq!(head(text), Err(want), "{text:?}");
        }
        assert_eq!(parse_head(&vec![b'a'; MAX_HEAD]), Err(RequestError::TooLarge));
        let many = format!("GET http://a.com/ HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(MAX_HEADERS + 1));
        assert_eq!(head(&many), Err(RequestError::TooManyHeaders));
    }

    #[test]
    fn socks5_parses() {
        assert_eq!(parse_greeting(&[5, 2, 2, 0]), Ok(Some(4)));
        assert_eq!(parse_greeting(&[5, 2, 2]), Ok(None));
        assert_eq!(parse_greeting(&[5, 1, 2]), Err(SocksError::NoMethod));
        assert_eq!(parse_greeting(&[4, 1]), Err(SocksError::Version));
        let mut req = vec![5, 1, 0, 3, 9];
        req.extend_from_slice(b"api.x.com");
        req.extend_from_slice(&443u16.to_be_bytes());
        let (t, n) = parse_socks_request(&req).unwrap().unwrap();
        assert_eq!((t.to_string(), n), ("api.x.com:443".to_string(), 16));
        assert_eq!(parse_socks_request(&req[..10]), Ok(None));
        assert_eq!(parse_socks_request(&[5, 2, 0, 1, 1, 2, 3, 4, 0, 80]), Err(SocksError::Command));
        assert_eq!(parse_socks_request(&[5, 1, 0, 9, 1]), Err(SocksError::AddressType));
        let (t, _) = parse_socks_request(&[5, 1, 0, 1, 10, 0, 0, 1, 0, 80]).unwrap().unwrap();
        assert_eq!(t.to_string(), "10.0.0.1:80");
        assert_eq!(
            parse_socks_request(&[5, 1, 0, 3, 3, b'1', b'.', b'2', 0, 80]),
            Err(SocksError::Host("an address in a form other than a.b.c.d"))
        );
    }
}
