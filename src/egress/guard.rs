//! The address guard: after a name is resolved (or an address given), the
//! address the proxy would connect to is refused when it is not a public
//! unicast address, unless the operator opened its range
//! ([`super::Policy::ranges`]). It is checked for every connection, on the
//! very address then connected to, so a name that resolves to a public
//! address once and to the metadata service the next time (DNS rebinding)
//! gains nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::policy::{Policy, canonical};

/// Why an address is special, or `None` for a public unicast address.
pub fn special(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

/// `Err(why)` when the guard refuses `ip` under `policy`.
pub fn check(ip: IpAddr, policy: &Policy) -> Result<(), &'static str> {
    match special(ip) {
        Some(why) if !policy.opened(ip) => Err(why),
        _ => Ok(()),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified (0.0.0.0/8)",
        (10, _, _) => "private (10.0.0.0/8)",
        (100, 64..=127, _) => "shared address space (100.64.0.0/10)",
        (127, _, _) => "loopback (127.0.0.0/8)",
        (169, 254, _) => "link-local (169.254.0.0/16, the metadata service)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (192, 0, 2) => "documentation (192.0.2.0/24)",
        (192, 88, 99) => "6to4 relay anycast (192.88.99.0/24)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
        (198, 51, 100) => "documentation (198.51.100.0/24)",
        (203, 0, 113) => "documentation (203.0.113.0/24)",
        (224..=239, _, _) => "multicast (224.0.0.0/4)",
        (240..=255, _, _) if ip == Ipv4Addr::BROADCAST => "broadcast (255.255.255.255)",
        (240..=255, _, _) => "reserved (240.0.0.0/4)",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let seg = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if ip.is_unspecified() {
        return Some("unspecified (::)");
    }
    if ip.is_loopback() {
        return Some("loopback (::1)");
    }
    Some(match seg[0] {
        // ::/96, IPv4-compatible (deprecated), and the rest of ::/8.
        0x0000 => "reserved (::/8)",
        // NAT64's well-known prefix: as the IPv4 address inside.
        0x0064 if seg[1..6] == [0xff9b, 0, 0, 0, 0] => return special_v4(embedded(seg[6], seg[7])),
        0x0064 if seg[1] == 0xff9b => "NAT64 local use (64:ff9b:1::/48)",
        0x0100 if seg[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        0x2001 if seg[1] == 0 => "Teredo (2001::/32)",
        0x2001 if seg[1] < 0x0200 => "IETF protocol assignments (2001::/23)",
        0x2001 if seg[1] == 0x0db8 => "documentation (2001:db8::/32)",
        // 6to4: as the IPv4 address inside.
        0x2002 => return special_v4(embedded(seg[1], seg[2])),
        0x3fff if seg[1] < 0x1000 => "documentation (3fff::/20)",
        s if s & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
        s if s & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
        s if s & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
        s if s & 0xff00 == 0xff00 => "multicast (ff00::/8)",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(ip: &str) -> Option<&'static str> {
        special(ip.parse().unwrap())
    }

    #[test]
    fn special_addresses_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "198.18.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001::1",
            "fec0::1",
        ] {
            assert!(why(ip).is_some(), "{ip} passed the guard");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "169.255.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert_eq!(why(ip), None, "{ip} was refused");
        }
    }

    #[test]
    fn opened_ranges_pass() {
        let policy = Policy::parse::<&str>(&[], &["127.0.0.0/8"]).unwrap();
        assert_eq!(check("127.0.0.2".parse().unwrap(), &policy), Ok(()));
        assert_eq!(check("::ffff:127.0.0.2".parse().unwrap(), &policy), Ok(()));
        assert!(check("169.254.169.254".parse().unwrap(), &policy).is_err());
    }
}
