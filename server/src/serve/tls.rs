//! TLS for the server (`--tls-cert FILE --tls-key FILE`): PEM files read with bounds, a
//! rustls configuration (ring, TLS 1.2 and 1.3, HTTP/1.1), so the one listener serves
//! `https://` and workers join over `wss://`.

use crate::files::read_bounded;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{crypto, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// Largest certificate chain or key file read.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// The acceptor for a certificate chain and its private key (PEM files).
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor> {
    let cert_pem = read_bounded(cert, MAX_PEM_BYTES)
        .with_context(|| format!("--tls-cert {}", cert.display()))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}: not a PEM certificate chain", cert.display()))?;
    if chain.is_empty() {
        bail!("--tls-cert {}: no certificate in it", cert.display());
    }
    let key_pem =
        read_bounded(key, MAX_PEM_BYTES).with_context(|| format!("--tls-key {}", key.display()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .with_context(|| format!("--tls-key {}: not a PEM private key", key.display()))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("the TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .context("the TLS certificate and key do not go together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
