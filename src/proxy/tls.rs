//! TLS for the link and the bootstrap registration: rustls with the
//! system's roots plus `tls.ca_file`, and an optional client certificate
//! (mTLS). Certificate verification is never disabled.
//!
//! The config is rebuilt from the files at every (re)connect, so rotating
//! the CA, the client certificate or its key needs no restart (docs/proxy.md,
//! "The link").

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::config::TlsConfig;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {reason}")]
    File { what: &'static str, path: String, reason: String },
    #[error("TLS setup: {0}")]
    Rustls(String),
    #[error("no trusted root certificates: the system has none and tls.ca_file is not set")]
    NoRoots,
}

fn file_err(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File { what, path: path.display().to_string(), reason: reason.to_string() }
}

/// The crypto provider (aws-lc-rs), named explicitly so the process never
/// depends on which provider another crate may have installed as default.
pub fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(what, path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(what, path, e))?;
    if certs.is_empty() {
        return Err(file_err(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// Builds the client config from the files named in `tls`, now.
pub fn client_config(tls: &TlsConfig) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!("system certificates: {e}");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!("system roots: {added} loaded, {ignored} unparsable");
    if let Some(ca) = &tls.ca_file {
        for cert in read_certs("tls.ca_file", ca)? {
            roots.add(cert).map_err(|e| file_err("tls.ca_file", ca, e))?;
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    let builder = rustls::ClientConfig::builder_with_provider(crypto())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let chain = read_certs("tls.client_cert", cert)?;
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|e| file_err("tls.client_key", key, e))?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                file_err("tls.client_cert", cert, format!("does not match tls.client_key: {e}"))
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}
