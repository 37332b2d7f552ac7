//! Certificates made by rcgen at test time: a CA, a server certificate for
//! the names a test asks for, and a client certificate (the daemon's TLS
//! and mTLS tests, the egress proxy's HTTPS stand-ins).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Certificates for a TLS backend, written to `dir`.
pub struct Pki {
    pub ca_file: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Pki {
    pub fn generate(dir: &Path) -> Pki {
        Self::generate_for(dir, &["localhost", "127.0.0.1"])
    }

    /// A PKI whose server certificate names `names` (host names or IP addresses).
    pub fn generate_for(dir: &Path, names: &[&str]) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "tuixiu test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(vec!["proxy.test".to_string()]).unwrap();
        client_params.distinguished_name.push(rcgen::DnType::CommonName, "proxy-test");
        let client = client_params.signed_by(&client_key, &issuer).unwrap();
        let w = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        Pki {
            ca_file: w("ca.pem", ca_cert.pem()),
            server_cert: w("server.pem", server.pem()),
            server_key: w("server.key", server_key.serialize_pem()),
            client_cert: w("client.pem", client.pem()),
            client_key: w("client.key", client_key.serialize_pem()),
        }
    }

    /// The server's TLS configuration (with `require_client_cert`, only
    /// clients with a certificate of the CA are accepted).
    pub fn server_config(&self, require_client_cert: bool) -> rustls::ServerConfig {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let certs: Vec<_> =
            CertificateDer::pem_file_iter(&self.server_cert).unwrap().collect::<Result<_, _>>().unwrap();
        let key = PrivateKeyDer::from_pem_file(&self.server_key).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(&self.ca_file).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        builder.with_single_cert(certs, key).unwrap()
    }
}
