//! Certificates made on the spot for TLS tests: a private CA, a server
//! certificate for the loopback addresses and a client certificate.

use std::path::PathBuf;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// PEM files of a fresh CA and two certificates it signed, in a temporary
/// directory removed on drop:
/// - `server_cert`/`server_key`: valid for `127.0.0.1`, `::1` and
///   `localhost`, for servers;
/// - `client_cert`/`client_key`: common name `dlock-test-client`, for
///   clients.
///
/// Each call makes a new, unrelated CA (a second one is a "wrong CA").
///
/// ```no_run
/// let certs = dlock_testkit::TestCerts::generate()?;
/// assert!(certs.ca.exists() && certs.server_cert.exists());
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Debug)]
pub struct TestCerts {
    _dir: tempfile::TempDir,
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server certificate's private key.
    pub server_key: PathBuf,
    /// The client certificate.
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
}

impl TestCerts {
    /// Makes the CA and both certificates.
    ///
    /// # Errors
    ///
    /// If a key cannot be generated or a file written.
    pub fn generate() -> Result<TestCerts> {
        let dir = tempfile::Builder::new()
            .prefix("dlock-certs-")
            .tempdir()
            .context("cannot create a directory for test certificates")?;

        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "dlock test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca = ca_params.self_signed(&ca_key)?;

        let leaf = |names: Vec<String>, name: &str, purpose: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names)?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![purpose];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca, &ca_key)?;
            Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
        };
        let loopback = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
        let (server_cert, server_key) = leaf(
            loopback,
            "dlock-test-server",
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) = leaf(
            Vec::new(),
            "dlock-test-client",
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;

        let write = |name: &str, pem: &str| -> Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, pem)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        };
        Ok(TestCerts {
            ca: write("ca.pem", &ca.pem())?,
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server-key.pem", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client-key.pem", &client_key)?,
            _dir: dir,
        })
    }
}
