//! HMAC-SHA256 signatures, and the secrets they use held where they are
//! used: signed `sandbox_control`s (the canonical form of a message, the
//! check of `signature` and `signed_at` against `control_signing_secret`:
//! docs/proxy.md, "Protections") and `register_agent`'s `auth`.

use hmac::{KeyInit, Mac};
use serde_json::Value;

use super::config::Secret;
use super::protocol::SandboxControl;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How far `signed_at` may be from now.
const SIGNATURE_WINDOW_SECS: i64 = 300;

/// Why a signed control is refused (the `error` of its result).
#[derive(Debug, thiserror::Error)]
pub enum SignatureError {
    #[error("the message cannot be re-encoded")]
    Reencode,
    #[error(
        "signature_required: {action} is destructive and this proxy requires signed controls \
         (control_signing_secret is set)"
    )]
    Required { action: String },
    #[error("signature_expired: signed_at is more than {} s from now", SIGNATURE_WINDOW_SECS)]
    Expired,
    #[error("signature_invalid: signed_at (unix seconds or ISO-8601) is required")]
    NoSignedAt,
    #[error("signature_invalid: not a hex HMAC-SHA256")]
    NotHex,
    #[error("signature_invalid: the signature of {action} does not match")]
    Mismatch { action: String },
}

/// Hex HMAC-SHA256 of `data` with `secret`.
pub fn hmac_hex(secret: &str, data: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(data);
    hex_lower(&mac.finalize().into_bytes())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The canonical form a signature covers: the message without `signature`,
/// members with `null` values omitted, object keys sorted, no whitespace.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> =
                    map.iter().filter(|(_, v)| !v.is_null()).map(|(k, _)| k).collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&map[*k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// The `control_signing_secret`, kept by what checks signatures: the
/// controls are given this, never the secret (the daemon takes it out of
/// the config it hands its runs).
pub struct Signer {
    secret: Option<Secret>,
}

impl Signer {
    pub fn new(secret: Option<Secret>) -> Signer {
        Signer { secret }
    }

    /// Checks `signature` (hex HMAC-SHA256, optionally `sha256=`-prefixed, of
    /// [`canonical_json`] of the message) and `signed_at` (unix seconds or
    /// ISO-8601, within 300 s of now, so a captured command cannot be replayed
    /// later). A no-op without `control_signing_secret`.
    pub fn verify(&self, c: &SandboxControl) -> Result<(), SignatureError> {
        let Some(secret) = &self.secret else { return Ok(()) };
        let action = c.action.as_str().unwrap_or("?");
        let Ok(Value::Object(mut msg)) = serde_json::to_value(c) else {
            return Err(SignatureError::Reencode);
        };
        let Some(Value::String(sig)) = msg.remove("signature") else {
            return Err(SignatureError::Required { action: action.to_string() });
        };
        let signed_at = match msg.get("signed_at") {
            Some(Value::Number(n)) => n.as_f64().map(|f| f as i64),
            Some(Value::String(s)) => humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
                .or_else(|_| humantime::parse_rfc3339(s))
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64),
            _ => None,
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        match signed_at {
            Some(t) if (now - t).abs() <= SIGNATURE_WINDOW_SECS => {}
            Some(_) => return Err(SignatureError::Expired),
            None => return Err(SignatureError::NoSignedAt),
        }
        let hex = sig.trim().strip_prefix("sha256=").unwrap_or(sig.trim());
        let Some(bytes) = decode_hex(hex) else {
            return Err(SignatureError::NotHex);
        };
        let mut mac = HmacSha256::new_from_slice(secret.expose().as_bytes()).expect("any key length");
        mac.update(canonical_json(&Value::Object(msg)).as_bytes());
        mac.verify_slice(&bytes).map_err(|_| SignatureError::Mismatch { action: action.to_string() })
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form() {
        let v = json!({"b":1,"a":{"y":null,"x":[1,"é"]},"n":null});
        assert_eq!(canonical_json(&v), r#"{"a":{"x":[1,"é"]},"b":1}"#);
    }

    #[test]
    fn hmac_known_answer() {
        // RFC 4231 test case 2.
        assert_eq!(
            hmac_hex("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
