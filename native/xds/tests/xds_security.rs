//! A cluster's TLS (gRFC A29) as the XdsClient validates it, with gRPC
//! C-core's rules: provider instances from the bootstrap, the deprecated
//! fields read when the current ones are empty, every field gRPC refuses
//! NACKed by name; and the bootstrap's `certificate_providers`.

// gRPC reads `match_subject_alt_names`, which Envoy deprecated.
#![allow(deprecated)]

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use tether_xds::bootstrap::{CertificateProvider, DEFAULT_REFRESH_INTERVAL};
use tether_xds::resource::security::{ProviderInstance, Roots, SanMatch, UpstreamTls};
use tether_xds::resource::{decode_with, pack, Resource, ResourceKind, ValidationOptions};
use tether_xds::Bootstrap;

use tls::common_tls_context::{
    CertificateProviderInstance, CombinedCertificateValidationContext, ValidationContextType as V,
};

fn options() -> ValidationOptions {
    let mut o = ValidationOptions::default();
    o.certificate_providers = ["roots".to_owned(), "identity".to_owned()].into();
    o
}

fn instance(name: &str) -> tls::CertificateProviderPluginInstance {
    tls::CertificateProviderPluginInstance {
        instance_name: name.into(),
        certificate_name: "default".into(),
    }
}

fn exact(s: &str) -> mpb::StringMatcher {
    mpb::StringMatcher {
        match_pattern: Some(mpb::string_matcher::MatchPattern::Exact(s.into())),
        ignore_case: false,
    }
}

fn cluster(common: tls::CommonTlsContext) -> cpb::Cluster {
    let context = tls::UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: "ignored.example".into(),
        ..Default::default()
    };
    cpb::Cluster {
        name: "c".into(),
        cluster_discovery_type: Some(cpb::cluster::ClusterDiscoveryType::Type(
            cpb::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cpb::cluster::EdsClusterConfig {
            eds_config: Some(core::ConfigSource {
                config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                    core::AggregatedConfigSource {},
                )),
                ..Default::default()
            }),
            service_name: String::new(),
        }),
        transport_socket: Some(core::TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(core::transport_socket::ConfigType::TypedConfig(pack(
                &context,
            ))),
        }),
        ..Default::default()
    }
}

fn decode(c: &cpb::Cluster) -> Result<Option<UpstreamTls>, Vec<String>> {
    match decode_with(ResourceKind::Cluster, &pack(c), options()).result {
        Ok(Resource::Cluster(c)) => Ok(c.security.clone()),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.errors.iter().map(ToString::to_string).collect()),
    }
}

fn mtls() -> tls::CommonTlsContext {
    tls::CommonTlsContext {
        tls_certificate_provider_instance: Some(instance("identity")),
        validation_context_type: Some(V::ValidationContext(tls::CertificateValidationContext {
            ca_certificate_provider_instance: Some(instance("roots")),
            match_subject_alt_names: vec![
                exact("spiffe://tether.test/ns/default/sa/backend"),
                mpb::StringMatcher {
                    match_pattern: Some(mpb::string_matcher::MatchPattern::Suffix(
                        ".TETHER.test".into(),
                    )),
                    ignore_case: true,
                },
            ],
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[test]
fn mtls_with_provider_instances_and_san_matchers() {
    let t = decode(&cluster(mtls())).unwrap().expect("security");
    let provider = |n: &str| ProviderInstance {
        instance_name: n.into(),
        certificate_name: "default".into(),
    };
    assert_eq!(t.roots, Roots::Provider(provider("roots")));
    assert_eq!(t.identity, Some(provider("identity")));
    assert_eq!(t.san_matchers.len(), 2);
    assert_eq!(
        t.san_matchers[0].matcher,
        SanMatch::Exact("spiffe://tether.test/ns/default/sa/backend".into())
    );
    assert!(t.san_matchers[1].ignore_case);
    // No transport socket: no security.
    let mut plain = cluster(mtls());
    plain.transport_socket = None;
    assert_eq!(decode(&plain).unwrap(), None);
}

/// Istio sends the deprecated fields (beside the new ones): they are read
/// when the new ones are empty.
#[test]
#[allow(deprecated)]
fn the_deprecated_provider_fields_are_read() {
    let old = |n: &str| CertificateProviderInstance {
        instance_name: n.into(),
        certificate_name: "ROOTCA".into(),
    };
    let common = tls::CommonTlsContext {
        tls_certificate_certificate_provider_instance: Some(old("identity")),
        validation_context_type: Some(V::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(tls::CertificateValidationContext {
                    match_subject_alt_names: vec![exact("spiffe://a")],
                    ..Default::default()
                }),
                validation_context_certificate_provider_instance: Some(old("roots")),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let t = decode(&cluster(common)).unwrap().unwrap();
    assert_eq!(
        t.roots,
        Roots::Provider(ProviderInstance {
            instance_name: "roots".into(),
            certificate_name: "ROOTCA".into()
        })
    );
    assert_eq!(t.identity.unwrap().instance_name, "identity");
    assert_eq!(t.san_matchers.len(), 1);

    // The new field wins inside a combined context.
    let common = tls::CommonTlsContext {
        validation_context_type: Some(V::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(tls::CertificateValidationContext {
                    ca_certificate_provider_instance: Some(instance("roots")),
                    ..Default::default()
                }),
                validation_context_certificate_provider_instance: Some(old("identity")),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let t = decode(&cluster(common)).unwrap().unwrap();
    assert!(matches!(&t.roots, Roots::Provider(p) if p.instance_name == "roots"));
    assert_eq!(t.identity, None);
}

const AT: &str = "transport_socket.typed_config.common_tls_context";

#[test]
#[allow(deprecated)]
fn what_grpc_refuses_is_nacked_by_field() {
    let with_validation = |f: &dyn Fn(&mut tls::CertificateValidationContext)| {
        let mut common = mtls();
        let Some(V::ValidationContext(v)) = &mut common.validation_context_type else {
            unreachable!()
        };
        f(v);
        common
    };
    let cases: Vec<(tls::CommonTlsContext, String)> = vec![
        (
            tls::CommonTlsContext {
                tls_certificate_provider_instance: Some(instance("identity")),
                ..Default::default()
            },
            format!("{AT}: no CA certificate provider instance configured"),
        ),
        (
            with_validation(&|v| v.ca_certificate_provider_instance = Some(instance("nope"))),
            format!(
                "{AT}.validation_context.ca_certificate_provider_instance.instance_name: \"nope\" \
                 is not a certificate provider instance of the bootstrap"
            ),
        ),
        (
            tls::CommonTlsContext {
                tls_certificate_provider_instance: Some(instance("other")),
                ..mtls()
            },
            format!(
                "{AT}.tls_certificate_provider_instance.instance_name: \"other\" is not a \
                 certificate provider instance of the bootstrap"
            ),
        ),
        (
            tls::CommonTlsContext {
                tls_params: Some(tls::TlsParameters::default()),
                ..mtls()
            },
            format!("{AT}.tls_params: is not supported"),
        ),
        (
            tls::CommonTlsContext {
                custom_handshaker: Some(core::TypedExtensionConfig::default()),
                ..mtls()
            },
            format!("{AT}.custom_handshaker: is not supported"),
        ),
        (
            tls::CommonTlsContext {
                tls_certificate_provider_instance: None,
                tls_certificates: vec![tls::TlsCertificate::default()],
                ..mtls()
            },
            format!(
                "{AT}.tls_certificates: is not supported (certificates come from a provider instance)"
            ),
        ),
        (
            tls::CommonTlsContext {
                tls_certificate_provider_instance: None,
                tls_certificate_sds_secret_configs: vec![tls::SdsSecretConfig::default()],
                ..mtls()
            },
            format!("{AT}.tls_certificate_sds_secret_configs: is not supported"),
        ),
        (
            tls::CommonTlsContext {
                validation_context_type: Some(V::ValidationContextSdsSecretConfig(
                    tls::SdsSecretConfig::default(),
                )),
                ..mtls()
            },
            format!("{AT}.validation_context_sds_secret_config: is not supported"),
        ),
        (
            with_validation(&|v| v.verify_certificate_spki = vec!["x".into()]),
            format!("{AT}.validation_context.verify_certificate_spki: is not supported"),
        ),
        (
            with_validation(&|v| v.verify_certificate_hash = vec!["x".into()]),
            format!("{AT}.validation_context.verify_certificate_hash: is not supported"),
        ),
        (
            with_validation(&|v| {
                v.require_signed_certificate_timestamp = Some(BoolValue { value: true })
            }),
            format!(
                "{AT}.validation_context.require_signed_certificate_timestamp: is not supported"
            ),
        ),
        (
            with_validation(&|v| v.crl = Some(core::DataSource::default())),
            format!("{AT}.validation_context.crl: is not supported"),
        ),
        (
            with_validation(&|v| v.custom_validator_config = Some(core::TypedExtensionConfig::default())),
            format!("{AT}.validation_context.custom_validator_config: is not supported"),
        ),
        (
            with_validation(&|v| {
                v.match_subject_alt_names = vec![mpb::StringMatcher {
                    match_pattern: Some(mpb::string_matcher::MatchPattern::SafeRegex(
                        mpb::RegexMatcher {
                            regex: "a.*".into(),
                            ..Default::default()
                        },
                    )),
                    ignore_case: true,
                }]
            }),
            format!(
                "{AT}.validation_context.match_subject_alt_names[0].ignore_case: is not supported \
                 with safe_regex"
            ),
        ),
    ];
    for (common, expected) in cases {
        let errors = decode(&cluster(common)).unwrap_err();
        assert_eq!(
            errors,
            std::slice::from_ref(&expected),
            "expected {expected}"
        );
    }
    // What C-core ignores is ignored: an inline trusted_ca beside a
    // provider, require_signed_certificate_timestamp false.
    let t = decode(&cluster(with_validation(&|v| {
        v.trusted_ca = Some(core::DataSource::default());
        v.require_signed_certificate_timestamp = Some(BoolValue { value: false });
    })));
    assert!(t.unwrap().is_some());
    // transport_socket_matches, and a transport socket that is not TLS.
    let mut c = cluster(mtls());
    c.transport_socket_matches = vec![cpb::cluster::TransportSocketMatch::default()];
    assert_eq!(
        decode(&c).unwrap_err(),
        ["transport_socket_matches: is not supported"]
    );
    let mut c = cluster(mtls());
    c.transport_socket = Some(core::TransportSocket {
        name: "raw".into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(Any {
            type_url:
                "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"
                    .into(),
            value: Vec::new(),
        })),
    });
    let errors = decode(&c).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("transport_socket.typed_config.type_url: "),
        "{errors:?}"
    );
}

fn bootstrap(providers: &str) -> Result<Bootstrap, String> {
    Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"127.0.0.1:1","channel_creds":[{{"type":"insecure"}}]}}],
            "node":{{"id":"n"}},"certificate_providers":{providers}}}"#
    ))
    .map_err(|e| e.to_string())
}

#[test]
fn bootstrap_certificate_providers() {
    let b = bootstrap(
        r#"{"both":{"plugin_name":"file_watcher","config":{"certificate_file":"c.pem",
            "private_key_file":"k.pem","ca_certificate_file":"ca.pem","refresh_interval":"0.5s"}},
            "roots":{"plugin_name":"file_watcher","config":{"ca_certificate_file":"ca.pem"}}}"#,
    )
    .unwrap();
    let CertificateProvider::FileWatcher(both) = &b.certificate_providers["both"] else {
        panic!()
    };
    // Below C-core's floor of a second: read every second.
    assert_eq!(both.refresh_interval, Duration::from_secs(1));
    assert_eq!(both.private_key_file.as_deref(), Some("k.pem".as_ref()));
    let CertificateProvider::FileWatcher(roots) = &b.certificate_providers["roots"] else {
        panic!()
    };
    assert_eq!(roots.refresh_interval, DEFAULT_REFRESH_INTERVAL);
    assert_eq!(roots.certificate_file, None);
    // A nanosecond was a busy loop, zero a panic in tokio's interval: both
    // read the files every second, as C-core does.
    for tiny in ["0.000000001s", "0s", "1.5s"] {
        let b = bootstrap(&format!(
            r#"{{"x":{{"plugin_name":"file_watcher","config":{{"ca_certificate_file":"a","refresh_interval":"{tiny}"}}}}}}"#
        ))
        .unwrap();
        let CertificateProvider::FileWatcher(x) = &b.certificate_providers["x"] else {
            panic!()
        };
        let want = if tiny == "1.5s" { 1500 } else { 1000 };
        assert_eq!(x.refresh_interval, Duration::from_millis(want), "{tiny}");
    }

    for (providers, expected) in [
        (
            r#"{"x":{"plugin_name":"meshca"}}"#,
            r#"bootstrap certificate_providers["x"].plugin_name: meshca is not a known plugin (tether knows "file_watcher")"#,
        ),
        (
            r#"{"x":{"plugin_name":"file_watcher","config":{"certificate_file":"c.pem"}}}"#,
            r#"bootstrap certificate_providers["x"].config: needs both certificate_file and private_key_file, or neither"#,
        ),
        (
            r#"{"x":{"plugin_name":"file_watcher","config":{}}}"#,
            r#"bootstrap certificate_providers["x"].config: needs certificate_file or ca_certificate_file"#,
        ),
        (
            r#"{"x":{"plugin_name":"file_watcher","config":{"ca_certificate_file":"a","refresh_interval":"soon"}}}"#,
            r#"bootstrap certificate_providers["x"].config.refresh_interval: soon is not a duration such as "600s""#,
        ),
    ] {
        assert_eq!(bootstrap(providers).unwrap_err(), expected);
    }
}

/// gRFC A82's `system_root_certs`: the system's roots when no provider
/// names roots; a provider instance wins over it (grpcio 1.85 reads the
/// field without A82's environment variable, and so does tether).
#[test]
fn system_root_certs_as_c_core_reads_them() {
    let system_only = tls::CommonTlsContext {
        validation_context_type: Some(V::ValidationContext(tls::CertificateValidationContext {
            system_root_certs: Some(tls::certificate_validation_context::SystemRootCerts {}),
            ..Default::default()
        })),
        ..Default::default()
    };
    assert_eq!(
        decode(&cluster(system_only)).unwrap().unwrap().roots,
        Roots::System
    );
    let mut both = mtls();
    if let Some(V::ValidationContext(v)) = &mut both.validation_context_type {
        v.system_root_certs = Some(tls::certificate_validation_context::SystemRootCerts {});
    }
    let roots = decode(&cluster(both)).unwrap().unwrap().roots;
    assert!(
        matches!(&roots, Roots::Provider(p) if p.instance_name == "roots"),
        "{roots:?}"
    );
}

fn with_san_matchers(matchers: Vec<mpb::StringMatcher>) -> cpb::Cluster {
    let mut common = mtls();
    if let Some(V::ValidationContext(v)) = &mut common.validation_context_type {
        v.match_subject_alt_names = matchers;
    }
    cluster(common)
}

/// An empty prefix, suffix, contains or exact matches every SAN: Envoy's
/// proto validation refuses it (min length 1), and so does tether.
#[test]
fn empty_san_matchers_are_nacked_by_field() {
    use mpb::string_matcher::MatchPattern as M;
    for (field, pattern) in [
        ("exact", M::Exact(String::new())),
        ("prefix", M::Prefix(String::new())),
        ("suffix", M::Suffix(String::new())),
        ("contains", M::Contains(String::new())),
    ] {
        let matcher = mpb::StringMatcher {
            match_pattern: Some(pattern),
            ignore_case: false,
        };
        assert_eq!(
            decode(&with_san_matchers(vec![exact("a.example"), matcher])).unwrap_err(),
            [format!(
                "{AT}.validation_context.match_subject_alt_names[1].{field}: is empty (it would \
                 match every SAN)"
            )]
        );
    }
}

/// A regex that would close the anchoring group (`x)|(.*`) is not a
/// regex on its own: RE2 refuses it, and so does tether, rather than
/// matching every SAN.
#[test]
fn a_san_regex_cannot_escape_its_anchors() {
    let regex = |r: &str| mpb::StringMatcher {
        match_pattern: Some(mpb::string_matcher::MatchPattern::SafeRegex(
            mpb::RegexMatcher {
                regex: r.into(),
                ..Default::default()
            },
        )),
        ignore_case: false,
    };
    for escape in ["x)|(.*", "x)|.*|(?:y", ".*)(", "a)|(?:.*"] {
        let errors = decode(&with_san_matchers(vec![regex(escape)])).unwrap_err();
        assert_eq!(errors.len(), 1, "{escape}: {errors:?}");
        let want = format!(
            "{AT}.validation_context.match_subject_alt_names[0].safe_regex.regex: {escape:?} is \
             not a valid regex"
        );
        assert!(errors[0].starts_with(&want), "{escape}: {errors:?}");
    }
    // A well-formed alternation still matches whole SANs only, each
    // branch in full (RE2's FullMatch, not the leftmost match's span).
    let t = decode(&with_san_matchers(vec![regex("a|ab")]))
        .unwrap()
        .unwrap();
    let SanMatch::Regex(p) = &t.san_matchers[0].matcher else {
        panic!("{:?}", t.san_matchers[0]);
    };
    assert!(p.regex.is_match("ab") && p.regex.is_match("a"));
    assert!(!p.regex.is_match("abc") && !p.regex.is_match("xab"));
}
