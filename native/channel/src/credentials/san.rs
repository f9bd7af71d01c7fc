//! The SANs of a server's certificate, as text, for the cluster's
//! `match_subject_alt_names` (matched by `tether_xds::resource::san`).
//! IP SANs are in their canonical text form (`2001:db8::1`). E-mail SANs
//! are not read, as C-core reads only DNS, URI and IP SANs (Envoy reads
//! them too).

use std::net::IpAddr;

/// The SANs of a certificate (DER) that matchers read: DNS names, URIs and
/// IP addresses as text; empty when it has none or cannot be parsed.
pub(crate) fn sans(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(s) | GeneralName::URI(s) => Some((*s).to_owned()),
            GeneralName::IPAddress(bytes) => ip_text(bytes),
            _ => None,
        })
        .collect()
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_of_a_certificate_in_canonical_form() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![
            rcgen::SanType::DnsName("backend.tether.test".try_into().unwrap()),
            rcgen::SanType::URI("spiffe://tether.test/sa/b".try_into().unwrap()),
            rcgen::SanType::IpAddress("2001:0db8:0:0::0001".parse().unwrap()),
            rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()),
            rcgen::SanType::Rfc822Name("ops@tether.test".try_into().unwrap()),
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            sans(cert.der()),
            [
                "backend.tether.test",
                "spiffe://tether.test/sa/b",
                "2001:db8::1",
                "127.0.0.1",
            ],
            "the e-mail SAN is not read, as C-core does not read it"
        );
        assert!(sans(b"not a certificate").is_empty());
    }
}
