//! Unit tests of `ca`.

use super::*;

fn dns(name: &str) -> LeafName {
    LeafName::parse(name).unwrap()
}

#[test]
fn leaf_chain_verifies_with_webpki_for_its_one_name_only() {
    let ca = Ca::create(&CaOptions::default()).unwrap();
    for name in ["origin.test", "a.b.example.com", "127.0.0.1", "::1"] {
        let name = LeafName::parse(name).unwrap();
        let leaf = ca.issue(&name).unwrap();
        assert_eq!(leaf.chain.len(), 2);
        assert_eq!(&leaf.chain[1], ca.cert_der());
        ca.verify_leaf(&leaf, &name).unwrap();
    }
    let leaf = ca.issue(&dns("origin.test")).unwrap();
    for other in ["other.test", "www.origin.test", "127.0.0.1"] {
        let err = ca.verify_leaf(&leaf, &LeafName::parse(other).unwrap());
        assert!(
            err.is_err(),
            "a leaf for origin.test must not verify for {other}"
        );
    }
    // Another CA's leaf does not chain to this one.
    let other = Ca::create(&CaOptions::default()).unwrap();
    let foreign = other.issue(&dns("origin.test")).unwrap();
    assert!(ca.verify_leaf(&foreign, &dns("origin.test")).is_err());
}

#[test]
fn leaf_is_short_lived_and_not_a_ca() {
    let ca = Ca::create(&CaOptions::default()).unwrap();
    let leaf = ca.issue(&dns("origin.test")).unwrap();
    let (_, x) = x509_parser::parse_x509_certificate(&leaf.chain[0]).unwrap();
    let v = x.validity();
    let span = v.not_after.timestamp() - v.not_before.timestamp();
    assert_eq!(
        span,
        i64::try_from((LEAF_VALIDITY + SKEW).as_secs()).unwrap()
    );
    assert!(!x.basic_constraints().unwrap().is_some_and(|b| b.value.ca));
    let sans = x.subject_alternative_name().unwrap().unwrap();
    assert_eq!(sans.value.general_names.len(), 1, "exactly one name");
}

#[test]
fn p384_ca_issues_verifiable_leaves() {
    let opts = CaOptions {
        algorithm: KeyAlgorithm::EcdsaP384,
        ..CaOptions::default()
    };
    let ca = Ca::create(&opts).unwrap();
    let leaf = ca.issue(&dns("origin.test")).unwrap();
    ca.verify_leaf(&leaf, &dns("origin.test")).unwrap();
}

#[test]
fn leaf_names_are_exactly_one_host() {
    assert_eq!(dns("Origin.Test."), LeafName::Dns("origin.test".into()));
    assert_eq!(
        LeafName::parse("::1").unwrap(),
        LeafName::Ip("::1".parse().unwrap())
    );
    for bad in [
        "",
        ".",
        "*.example.com",
        "a b",
        "exa mple.com",
        "[::1]",
        "a..b",
    ] {
        assert!(
            matches!(LeafName::parse(bad), Err(Error::BadName { .. })),
            "{bad:?} must be refused"
        );
    }
}

#[test]
fn ca_persists_across_restarts_with_a_0600_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ca");
    let first = Ca::load_or_create(&dir, &CaOptions::default()).unwrap();
    let key_mode = std::fs::metadata(dir.join(CA_KEY_FILE))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(key_mode, 0o600);
    let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700);
    let second = Ca::load_or_create(&dir, &CaOptions::default()).unwrap();
    assert_eq!(
        first.cert_der(),
        second.cert_der(),
        "the same CA after a restart"
    );
    assert_eq!(first.cert_pem(), second.cert_pem());
    assert_eq!(
        std::fs::read_to_string(dir.join(CA_CERT_FILE)).unwrap(),
        first.cert_pem()
    );
    // The reloaded CA signs leaves that chain to the original certificate.
    let leaf = second.issue(&dns("origin.test")).unwrap();
    first.verify_leaf(&leaf, &dns("origin.test")).unwrap();
}

#[test]
fn key_readable_by_others_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap();
    let key = tmp.path().join(CA_KEY_FILE);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(
        matches!(err, Error::KeyPermissions { mode: 0o644, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[test]
fn half_a_ca_is_refused_not_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = Ca::create(&CaOptions::default()).unwrap();
    std::fs::write(tmp.path().join(CA_CERT_FILE), ca.cert_pem()).unwrap();
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Incomplete { .. }), "{err}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join(CA_CERT_FILE)).unwrap(),
        ca.cert_pem()
    );
}

/// Writes a CA made directly with rcgen (validity and CA flag as given) into `dir`.
fn write_raw_ca(dir: &Path, not_before: SystemTime, not_after: SystemTime, is_ca: bool) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    if is_ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    }
    params.not_before = OffsetDateTime::from(not_before);
    params.not_after = OffsetDateTime::from(not_after);
    let cert = params.self_signed(&key).unwrap();
    write_atomic(&dir.join(CA_CERT_FILE), cert.pem().as_bytes(), 0o644).unwrap();
    write_atomic(
        &dir.join(CA_KEY_FILE),
        key.serialize_pem().as_bytes(),
        0o600,
    )
    .unwrap();
}

#[test]
fn expired_ca_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    write_raw_ca(tmp.path(), now - 10 * day, now - day, true);
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
    // Not valid yet is refused the same way.
    write_raw_ca(tmp.path(), now + day, now + 10 * day, true);
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err}");
}

#[test]
fn non_ca_certificate_and_foreign_key_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    write_raw_ca(tmp.path(), now - day, now + day, false);
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(matches!(err, Error::NotUsable { .. }), "{err}");

    write_raw_ca(tmp.path(), now - day, now + day, true);
    let other = KeyPair::generate().unwrap();
    write_atomic(
        &tmp.path().join(CA_KEY_FILE),
        other.serialize_pem().as_bytes(),
        0o600,
    )
    .unwrap();
    let err = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("not this certificate's key"),
        "{err}"
    );
}

#[test]
fn an_operator_supplied_ca_is_loaded_and_used() {
    let tmp = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    write_raw_ca(tmp.path(), now - day, now + 30 * day, true);
    let ca = Ca::load_or_create(tmp.path(), &CaOptions::default()).unwrap();
    let leaf = ca.issue(&dns("origin.test")).unwrap();
    ca.verify_leaf(&leaf, &dns("origin.test")).unwrap();
    // Leaves never outlive the CA.
    assert!(leaf.not_after <= ca.not_after());
}
