//! The Bearer token of the link.
//!
//! * `auth_token` is used as it is.
//! * Otherwise, with `register_url` + `bootstrap_token`, the token is obtained
//!   by `POST register_url` (header `x-acp-proxy-bootstrap`, body `{proxyId,
//!   name}` → `{success, data:{token}}`, docs/protocol.md, "Transport and
//!   authentication"), and obtained again when the backend rejects it (close
//!   1008, HTTP 401) or when it nears its `exp` (the Node proxy registered once
//!   and then failed forever once the token expired).
//! * A configured `auth_token` that the backend rejects falls back to the
//!   bootstrap registration when that is configured too.
//!
//! Tokens and the bootstrap secret never reach a log line.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::Value;

use super::config::{Config, Secret, is_loopback_host, url_parts};

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("bootstrap registration at {url}: {reason}")]
    Register { url: String, reason: String },
}

#[derive(Clone, Debug)]
struct Token {
    value: Secret,
    exp: Option<u64>,
    iat: Option<u64>,
}

impl Token {
    fn new(value: Secret) -> Token {
        let (exp, iat) = jwt_times(value.expose());
        Token { value, exp, iat }
    }

    /// Whether the token expires within a tenth of its lifetime (at least a minute).
    fn near_expiry(&self, now: u64) -> bool {
        let Some(exp) = self.exp else { return false };
        let lifetime = self.iat.map_or(0, |iat| exp.saturating_sub(iat));
        let margin = (lifetime / 10).max(60);
        now + margin >= exp
    }
}

/// `exp` and `iat` of a JWT's payload, if it is one.
fn jwt_times(token: &str) -> (Option<u64>, Option<u64>) {
    let Some(payload) = token.split('.').nth(1) else { return (None, None) };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload.trim_end_matches('='))
    else {
        return (None, None);
    };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { return (None, None) };
    (v.get("exp").and_then(Value::as_u64), v.get("iat").and_then(Value::as_u64))
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The secrets the link authenticates with, out of the config: the daemon
/// keeps them for the link alone.
pub struct LinkSecrets {
    pub(super) auth_token: Option<Secret>,
    pub(super) bootstrap_token: Option<Secret>,
    /// Signs `register_agent` (`signing::hmac_hex`).
    pub(super) register_hmac_secret: Option<Secret>,
}

pub struct TokenSource {
    configured: Option<Token>,
    configured_rejected: bool,
    bootstrap: Option<(String, Secret)>,
    current: Option<Token>,
    proxy_id: String,
    name: String,
    allow_insecure: bool,
}

impl TokenSource {
    pub fn new(cfg: &Config, secrets: &LinkSecrets, proxy_id: &str) -> TokenSource {
        TokenSource {
            configured: secrets.auth_token.clone().map(Token::new),
            configured_rejected: false,
            bootstrap: cfg.register_url.clone().zip(secrets.bootstrap_token.clone()),
            current: None,
            proxy_id: proxy_id.to_string(),
            name: cfg.agent.name.clone().unwrap_or_else(|| proxy_id.to_string()),
            allow_insecure: cfg.allow_insecure_ws,
        }
    }

    /// The backend refused the token (close 1008 or HTTP 401/403): the next
    /// [`TokenSource::token`] obtains a new one if it can.
    pub fn rejected(&mut self) {
        if let Some(cur) = self.current.take() {
            if self.configured.as_ref().is_some_and(|c| c.value == cur.value) {
                self.configured_rejected = true;
                if self.bootstrap.is_some() {
                    tracing::warn!(
                        "the backend rejected auth_token: falling back to the bootstrap registration"
                    );
                } else {
                    tracing::error!(
                        "the backend rejected auth_token (close 1008 Unauthorized): fix auth_token; retrying"
                    );
                }
            } else {
                tracing::warn!("the backend rejected the registered token: registering again");
            }
        }
    }

    /// The token for the next connect; `None` connects without one.
    pub async fn token(
        &mut self,
        tls: impl Fn() -> Option<rustls::ClientConfig>,
    ) -> Result<Option<Secret>, AuthError> {
        let now = now_secs();
        if let Some(cur) = &self.current
            && !(cur.near_expiry(now) && self.bootstrap.is_some())
        {
            return Ok(Some(cur.value.clone()));
        }
        if let Some(conf) = &self.configured
            && (!self.configured_rejected || self.bootstrap.is_none())
            && !(conf.near_expiry(now) && self.bootstrap.is_some())
        {
            self.current = Some(conf.clone());
            return Ok(Some(conf.value.clone()));
        }
        let Some((url, secret)) = self.bootstrap.clone() else {
            return Ok(self.configured.as_ref().map(|c| c.value.clone()));
        };
        let token = self.register(&url, &secret, tls()).await?;
        if let Some(exp) = token.exp {
            tracing::info!("registered at {url}: token valid until {}", super::iso_from_secs(exp));
        } else {
            tracing::info!("registered at {url}");
        }
        self.current = Some(token.clone());
        Ok(Some(token.value))
    }

    async fn register(
        &self,
        url: &str,
        secret: &Secret,
        tls: Option<rustls::ClientConfig>,
    ) -> Result<Token, AuthError> {
        let err = |reason: String| AuthError::Register { url: url.to_string(), reason };
        let parts = url_parts(url).map_err(|e| err(e.to_string()))?;
        if parts.scheme == "http" && !is_loopback_host(&parts.host) && !self.allow_insecure {
            return Err(err(
                "plain http to a non-loopback host would send the bootstrap token in clear: use https \
                 (or set allow_insecure_ws = true, for testing only)"
                    .into(),
            ));
        }
        let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30)).no_proxy();
        if let Some(mut tls) = tls {
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            builder = builder.tls_backend_preconfigured(tls);
        }
        let client = builder.build().map_err(|e| err(format!("HTTP client: {e}")))?;
        let body = serde_json::json!({"proxyId": self.proxy_id, "name": self.name});
        let resp = client
            .post(url)
            .header("content-type", "application/json")
            .header("x-acp-proxy-bootstrap", secret.expose())
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| err(error_chain(&e)))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| err(error_chain(&e)))?;
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = json
                .pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| text.chars().take(200).collect());
            return Err(err(format!("HTTP {status}: {message}")));
        }
        let token = json
            .pointer("/data/token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| err("the response has no data.token".into()))?;
        Ok(Token::new(Secret::new(token)))
    }
}

/// An error with its sources, on one line (reqwest's top-level message
/// alone says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b(r#"{"alg":"HS256"}"#), b(payload))
    }

    #[test]
    fn expiry() {
        let t = Token::new(Secret::new(jwt(r#"{"type":"acp_proxy","iat":1000,"exp":2000}"#)));
        assert_eq!((t.exp, t.iat), (Some(2000), Some(1000)));
        assert!(!t.near_expiry(1800));
        assert!(t.near_expiry(1901));
        let opaque = Token::new(Secret::new("not-a-jwt"));
        assert!(!opaque.near_expiry(u64::MAX / 2));
    }
}
