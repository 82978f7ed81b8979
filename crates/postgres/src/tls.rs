//! TLS for `sslmode=prefer|require`: rustls with the Mozilla roots, plus `sslrootcert`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PostgresError;

/// A connector that verifies the server's certificate against the Mozilla roots and the
/// certificates in `root_cert`, if given.
pub(crate) fn connector(root_cert: Option<&Path>) -> Result<MakeRustlsConnect, PostgresError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = root_cert {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| {
                PostgresError::Tls(format!("cannot read sslrootcert {}: {e}", path.display()))
            })?;
        if certs.is_empty() {
            return Err(PostgresError::Tls(format!(
                "sslrootcert {} holds no certificate",
                path.display()
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| PostgresError::Tls(format!("sslrootcert {}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PostgresError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
