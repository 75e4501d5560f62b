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

    /// A server certificate and its key as `{prefix}cert.pem` and `{prefix}key.pem` (the
    /// first, `cert.pem` and `key.pem`, is made with the CA); returns (cert, key) paths.
    pub fn issue(&self, prefix: &str) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("params")
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
