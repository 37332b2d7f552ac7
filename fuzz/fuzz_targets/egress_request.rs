//! What a client inside a proxied sandbox sends the egress proxy, and the
//! operator's allowlist: the first byte picks the parser.
//!
//! * 0: an HTTP request head (`egress::request::parse_head`); a head that
//!   parses is also parsed from each of its prefixes, which must be
//!   incomplete, never an error (the proxy reads a head in pieces); a
//!   forwarded request's origin-form head is well formed (CRLF lines, no
//!   `Proxy-*`, one `Host`, our `Connection`).
//! * 1: a SOCKS5 greeting then a request (`parse_greeting`,
//!   `parse_socks_request`), lengths within the input.
//! * 2: allowlist lines (`Rule::parse`, `Range::parse`): what parses prints
//!   back to what parses the same, covers itself, and narrowing a policy
//!   to the parsed rules keeps only covered ones.
//!
//! Checked: no panic; errors one line; the properties above.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tuixiu_sandbox::egress::policy::{Policy, Range, Rule};
use tuixiu_sandbox::egress::request::{self, Ask, Host, MAX_HEAD, Target};
use tuixiu_sandbox_fuzz::assert_one_line;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    match pick % 3 {
        0 => head(rest),
        1 => socks(rest),
        _ => allowlist(rest),
    }
});

fn head(data: &[u8]) {
    let parsed = match request::parse_head(data) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return assert!(data.len() < MAX_HEAD),
        Err(e) => return assert_one_line("request error", &e.to_string()),
    };
    assert!(parsed.len <= data.len() && parsed.len <= MAX_HEAD);
    for cut in 0..parsed.len {
        assert_eq!(request::parse_head(&data[..cut]), Ok(None), "prefix of {cut} bytes");
    }
    match parsed.ask {
        Ask::Connect(target) => round_trip(&target),
        Ask::Forward { target, method, path, http10, headers } => {
            round_trip(&target);
            let out = request::origin_head(&target, &method, &path, http10, &headers);
            let text = String::from_utf8(out).expect("the head is text");
            let body = text.strip_suffix("\r\n\r\n").expect("ends the head");
            let mut lines = body.split("\r\n");
            let first = lines.next().unwrap();
            assert!(first.starts_with(&format!("{method} /")) || first.starts_with(&format!("{method} ?")));
            let mut hosts = 0;
            let mut connection = 0;
            for line in lines {
                assert!(!line.contains(['\r', '\n']), "{line:?}");
                let (name, _) = line.split_once(": ").expect("name: value");
                let lower = name.to_ascii_lowercase();
                assert!(!lower.starts_with("proxy-"), "{line:?}");
                hosts += usize::from(lower == "host");
                connection += usize::from(lower == "connection");
            }
            assert_eq!((hosts, connection), (1, 1), "{text:?}");
        }
    }
}

fn round_trip(target: &Target) {
    let again = Target::parse_authority(&target.to_string(), None).expect("a target prints as one");
    assert_eq!(&again, target);
    if let Host::Name(name) = &target.host {
        assert!(name.len() <= 253 && !name.ends_with('.') && name.bytes().all(|b| !b.is_ascii_uppercase()));
    }
}

fn socks(data: &[u8]) {
    let used = match request::parse_greeting(data) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => return assert_one_line("socks error", &e.to_string()),
    };
    assert!(used <= data.len());
    match request::parse_socks_request(&data[used..]) {
        Ok(Some((target, n))) => {
            assert!(used + n <= data.len() && target.port != 0);
            round_trip(&target);
        }
        Ok(None) => {}
        Err(e) => assert_one_line("socks error", &e.to_string()),
    }
}

fn allowlist(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut rules = Vec::new();
    for line in text.lines().take(64) {
        match Rule::parse(line) {
            Ok(rule) => {
                let again = Rule::parse(&rule.to_string()).expect("a rule prints as one");
                assert_eq!(again, rule);
                assert!(rule.covers(&rule));
                rules.push(rule);
            }
            Err(e) => assert_one_line("rule error", &e.to_string()),
        }
        match Range::parse(line) {
            Ok(range) => {
                assert_eq!(Range::parse(&range.to_string()), Ok(range));
                assert!(range.contains(range.addr));
            }
            Err(e) => assert_one_line("range error", &e.to_string()),
        }
    }
    let (ours, wanted) = rules.split_at(rules.len() / 2);
    let policy = Policy { hosts: ours.to_vec(), ranges: Vec::new() };
    match policy.narrowed(wanted) {
        Ok(narrowed) => assert!(narrowed.hosts.iter().all(|w| ours.iter().any(|o| o.covers(w)))),
        Err(rule) => assert!(!ours.iter().any(|o| o.covers(&rule))),
    }
}
