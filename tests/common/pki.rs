//! Certificates made by the tests: a private CA, and server certificates for 127.0.0.1 and
//! localhost signed by it, written as PEM files in a temp dir.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    /// A new CA named `name`; its certificate is `ca.pem` in the dir.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::tempdir().expect("tmp");
        let ca_key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let ca = params.self_signed(&ca_key).expect("ca");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write");
        let pki = Pki { dir, ca, ca_key };
        pki.issue("");
        pki
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().to_string()
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA certificate (DER), for a rustls client.
    #[allow(dead_code)]
    pub fn ca_der(&self) -> rustls::pki_types::CertificateDer<'static> {
        self.ca.der().clone()
    }

    /// A server certificate and its key as `{prefix}cert.pem` and `{prefix}key.pem` (the
    /// first, `cert.pem` and `key.pem`, is made with the CA); returns (cert, key) paths.
    pub fn issue(&self, prefix: &str) -> (String, String) {
        self.issue_until(prefix, None)
    }

    /// `issue` with the certificate valid until `not_after` (Unix seconds; None: rcgen's
    /// default, far in the future).
    pub fn issue_until(&self, prefix: &str, not_after: Option<i64>) -> (String, String) {
        self.issue_for(prefix, KeyPair::generate().expect("key"), not_after)
    }

    /// A certificate for the key already in `key_path` (a renewal that keeps its key).
    pub fn reissue(
        &self,
        prefix: &str,
        key_path: &str,
        not_after: Option<i64>,
    ) -> (String, String) {
        let pem = std::fs::read_to_string(key_path).expect("key file");
        self.issue_for(prefix, KeyPair::from_pem(&pem).expect("key"), not_after)
    }

    fn issue_for(&self, prefix: &str, key: KeyPair, not_after: Option<i64>) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("params");
        if let Some(t) = not_after {
            params.not_before =
                time::OffsetDateTime::from_unix_timestamp(t - 86_400 * 365).expect("time");
            params.not_after = time::OffsetDateTime::from_unix_timestamp(t).expect("time");
        }
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("cert");
        let (c, k) = (
            self.path(&format!("{prefix}cert.pem")),
            self.path(&format!("{prefix}key.pem")),
        );
        std::fs::write(&c, cert.pem()).expect("write");
        std::fs::write(&k, key.serialize_pem()).expect("write");
        (c, k)
    }
}
