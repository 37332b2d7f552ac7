//! The allowlist: which destinations a proxied sandbox may reach
//! (`--allow-host`), and which special address ranges the operator opened
//! despite the address guard (`--allow-range`).
//!
//! A rule is `PATTERN[:PORT]`: an exact host name (`api.openai.com`), a
//! wildcard of its subdomains (`*.example.com`: `a.example.com` and
//! `a.b.example.com`, not `example.com` itself), or an IP literal
//! (`203.0.113.7`, `[2001:db8::7]`); the port is a number or `*` (any),
//! 443 when left out. Names are compared in lower case without a trailing
//! dot, ASCII only (an internationalized name is written in its `xn--`
//! form).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::request::Host;

/// The port a rule without one allows.
pub const DEFAULT_PORT: u16 = 443;

/// What a rule's host part matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// Names ending in `.` + this suffix (at least one more label).
    Subdomains(String),
    /// This address only (no name resolves to it through the rule).
    Ip(IpAddr),
}

/// Which ports a rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Ports {
    Any,
    One(u16),
}

/// One allowlist entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rule {
    pub host: HostPattern,
    pub ports: Ports,
}

/// An address range in CIDR form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Range {
    pub addr: IpAddr,
    pub prefix: u8,
}

/// The whole policy of one sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Policy {
    pub hosts: Vec<Rule>,
    /// Special ranges (loopback, private, ...) the address guard lets
    /// through: the operator's explicit choice.
    pub ranges: Vec<Range>,
}

/// Why a rule or range was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("{0:?}: empty")]
    Empty(String),
    #[error("{0:?}: not a host name, *.name or IP address ({1})")]
    Host(String, &'static str),
    #[error("{0:?}: the port must be a number from 1 to 65535, or *")]
    Port(String),
    #[error("{0:?}: expected ADDRESS/PREFIX, e.g. 10.0.0.0/8 or fd00::/8")]
    Range(String),
    #[error("{0:?}: the prefix length is longer than the address")]
    Prefix(String),
}

impl Rule {
    /// Parses `PATTERN[:PORT]`.
    pub fn parse(text: &str) -> Result<Rule, PatternError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(PatternError::Empty(text.into()));
        }
        let (host, port) = split_port(t).ok_or_else(|| PatternError::Port(text.into()))?;
        let ports = match port {
            None => Ports::One(DEFAULT_PORT),
            Some("*") => Ports::Any,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ports::One(n),
                _ => return Err(PatternError::Port(text.into())),
            },
        };
        let host = match host.strip_prefix("*.") {
            Some(suffix) => match Host::parse(suffix) {
                Ok(Host::Name(name)) => HostPattern::Subdomains(name),
                Ok(Host::Ip(_)) => return Err(PatternError::Host(text.into(), "a wildcard of an address")),
                Err(why) => return Err(PatternError::Host(text.into(), why)),
            },
            None => match Host::parse(host) {
                Ok(Host::Name(name)) => HostPattern::Exact(name),
                Ok(Host::Ip(ip)) => HostPattern::Ip(ip),
                Err(why) => return Err(PatternError::Host(text.into(), why)),
            },
        };
        Ok(Rule { host, ports })
    }

    /// Whether this rule lets `host:port` through.
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.ports {
            Ports::Any => true,
            Ports::One(p) => p == port,
        };
        port_ok
            && match (&self.host, host) {
                (HostPattern::Exact(want), Host::Name(name)) => want == name,
                (HostPattern::Subdomains(suffix), Host::Name(name)) => is_subdomain(name, suffix),
                (HostPattern::Ip(want), Host::Ip(ip)) => canonical(*want) == canonical(*ip),
                _ => false,
            }
    }

    /// Whether everything `other` allows, this rule allows too.
    pub fn covers(&self, other: &Rule) -> bool {
        let ports = match (self.ports, other.ports) {
            (Ports::Any, _) => true,
            (Ports::One(a), Ports::One(b)) => a == b,
            (Ports::One(_), Ports::Any) => false,
        };
        ports
            && match (&self.host, &other.host) {
                (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
                (HostPattern::Subdomains(a), HostPattern::Exact(b)) => is_subdomain(b, a),
                (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) => a == b || is_subdomain(b, a),
                (HostPattern::Ip(a), HostPattern::Ip(b)) => canonical(*a) == canonical(*b),
                _ => false,
            }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(name) => write!(f, "{name}")?,
            HostPattern::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostPattern::Ip(ip) => write!(f, "{ip}")?,
        }
        match self.ports {
            Ports::Any => write!(f, ":*"),
            Ports::One(p) => write!(f, ":{p}"),
        }
    }
}

impl Range {
    /// Parses `ADDRESS/PREFIX`; a bare address is a range of one.
    pub fn parse(text: &str) -> Result<Range, PatternError> {
        let t = text.trim();
        let (addr, prefix) = match t.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (t, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| PatternError::Range(text.into()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) if !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| PatternError::Range(text.into()))?
            }
            Some(_) => return Err(PatternError::Range(text.into())),
        };
        if prefix > max {
            return Err(PatternError::Prefix(text.into()));
        }
        Ok(Range { addr, prefix })
    }

    /// Whether `ip` (IPv4-mapped IPv6 taken as IPv4) lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (canonical(self.addr), canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(u128::from(u32::from(net)) << 96, u128::from(u32::from(ip)) << 96, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(u128::from(net), u128::from(ip), self.prefix),
            _ => false,
        }
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8) -> bool {
    prefix == 0 || (a ^ b) >> (128 - u32::from(prefix)) == 0
}

impl Policy {
    /// The rules and ranges as the command line or a config gives them.
    pub fn parse<S: AsRef<str>>(hosts: &[S], ranges: &[S]) -> Result<Policy, PatternError> {
        Ok(Policy {
            hosts: hosts.iter().map(|h| Rule::parse(h.as_ref())).collect::<Result<_, _>>()?,
            ranges: ranges.iter().map(|r| Range::parse(r.as_ref())).collect::<Result<_, _>>()?,
        })
    }

    /// The first rule that lets `host:port` through.
    pub fn rule_for(&self, host: &Host, port: u16) -> Option<&Rule> {
        self.hosts.iter().find(|r| r.allows(host, port))
    }

    /// Whether the operator opened a range holding `ip`.
    pub fn opened(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    /// This policy narrowed to `wanted` (a run's own list): every wanted
    /// rule must be covered by one of ours; the ranges stay ours. The first
    /// rule that would widen the policy is the error.
    pub fn narrowed(&self, wanted: &[Rule]) -> Result<Policy, Rule> {
        for rule in wanted {
            if !self.hosts.iter().any(|ours| ours.covers(rule)) {
                return Err(rule.clone());
            }
        }
        Ok(Policy { hosts: wanted.to_vec(), ranges: self.ranges.clone() })
    }
}

/// Reads a file of rules: one per line, `#` starts a comment.
pub fn read_rules_file(path: &std::path::Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut rules = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        Rule::parse(line).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
        rules.push(line.to_string());
    }
    Ok(rules)
}

/// `name` is a strict subdomain of `suffix`.
fn is_subdomain(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// `host[:port]`, `[v6][:port]`, or a bare IPv6 address (no port).
fn split_port(t: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = t.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        return match after {
            "" => Some((inside, None)),
            p => Some((inside, Some(p.strip_prefix(':')?))),
        };
    }
    match t.matches(':').count() {
        0 => Some((t, None)),
        1 => t.split_once(':').map(|(h, p)| (h, Some(p))),
        _ => Some((t, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> Host {
        Host::parse(n).unwrap()
    }

    #[test]
    fn rules_parse_with_the_default_port() {
        let r = Rule::parse("API.OpenAI.com.").unwrap();
        assert_eq!(r, Rule { host: HostPattern::Exact("api.openai.com".into()), ports: Ports::One(443) });
        assert_eq!(Rule::parse("*.example.com:*").unwrap().to_string(), "*.example.com:*");
        assert_eq!(Rule::parse("[2001:db8::1]:8443").unwrap().to_string(), "[2001:db8::1]:8443");
        assert_eq!(Rule::parse("2001:db8::1").unwrap().to_string(), "[2001:db8::1]:443");
        assert_eq!(Rule::parse("203.0.113.9:80").unwrap().to_string(), "203.0.113.9:80");
        for bad in ["", "a:0", "a:70000", "a:+1", "*.1.2.3.4", "a..b", "-a.com", "bücher.de", "a b", "127.1"]
        {
            assert!(Rule::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let r = Rule::parse("*.example.com").unwrap();
        assert!(r.allows(&name("a.example.com"), 443));
        assert!(r.allows(&name("a.b.example.com"), 443));
        assert!(!r.allows(&name("example.com"), 443));
        assert!(!r.allows(&name("badexample.com"), 443));
        assert!(!r.allows(&name("a.example.com"), 80));
        assert!(!r.allows(&name("a.example.com.evil.net"), 443));
    }

    #[test]
    fn ip_rules_match_mapped_forms() {
        let r = Rule::parse("203.0.113.9:443").unwrap();
        assert!(r.allows(&Host::Ip("::ffff:203.0.113.9".parse().unwrap()), 443));
        assert!(!r.allows(&name("example.com"), 443));
    }

    #[test]
    fn ranges_contain() {
        let r = Range::parse("127.0.0.0/8").unwrap();
        assert!(r.contains("127.4.5.6".parse().unwrap()));
        assert!(r.contains("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!r.contains("128.0.0.1".parse().unwrap()));
        assert!(Range::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(Range::parse("fd00::/8").unwrap().contains("fd12::1".parse().unwrap()));
        assert!(Range::parse("10.0.0.0/33").is_err());
        assert!(Range::parse("10.0.0.0/").is_err());
        assert!(Range::parse("ten/8").is_err());
    }

    #[test]
    fn narrowing_never_widens() {
        let ours = Policy::parse(&["*.openai.com", "example.org:*"], &["10.0.0.0/8"]).unwrap();
        let run = [Rule::parse("api.openai.com").unwrap(), Rule::parse("example.org:8080").unwrap()];
        let narrowed = ours.narrowed(&run).unwrap();
        assert_eq!(narrowed.hosts, run);
        assert_eq!(narrowed.ranges, ours.ranges);
        for wider in ["openai.com", "*.com", "api.openai.com:*", "1.2.3.4"] {
            let rule = Rule::parse(wider).unwrap();
            assert_eq!(ours.narrowed(std::slice::from_ref(&rule)), Err(rule), "{wider}");
        }
    }
}
