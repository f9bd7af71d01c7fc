//! A cluster's `transport_socket` as gRFC A29 reads it: an
//! `UpstreamTlsContext` naming the bootstrap's certificate provider
//! instances for the roots (required) and the identity (optional, mTLS),
//! and the SAN matchers a server's certificate must satisfy.
//!
//! Validation follows gRPC C-core: the current fields first, the
//! deprecated certificate-provider fields when those are empty (Istio
//! sends both); what gRPC does not support (`tls_params`,
//! `custom_handshaker`, inline certificates or SDS secrets, SPKI or hash
//! pins, signed certificate timestamps, CRLs, a custom validator,
//! `transport_socket_matches`) and a provider instance the bootstrap does
//! not define NACK the cluster,
//! naming the field. Fields A29 ignores (`sni`, `allow_renegotiation`,
//! `max_session_keys`, ALPN lists...) are ignored, and so, as C-core does,
//! are an inline `trusted_ca` and `match_typed_subject_alt_names`.
//!
//! `system_root_certs` (gRFC A82): when the CA provider instance is unset,
//! the server's chain must end in the system's roots. A82 guards it with
//! `GRPC_EXPERIMENTAL_XDS_SYSTEM_ROOT_CERTS`; grpcio 1.85 reads it whatever
//! that variable says, and so does tether.

use envoy_types::pb::envoy::config::cluster::v3 as cpb;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use envoy_types::pb::envoy::r#type::matcher::v3 as mpb;
use tls::common_tls_context::ValidationContextType as V;

use super::route::Pattern;
use super::Check;

/// A certificate provider instance of the bootstrap's
/// `certificate_providers`, and which certificate of it to use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProviderInstance {
    /// The instance's key in the bootstrap's `certificate_providers`.
    pub instance_name: String,
    /// The certificate's name within the instance (file_watcher ignores it).
    pub certificate_name: String,
}

/// How a SAN is matched (envoy's `StringMatcher`).
#[derive(Debug, Clone, PartialEq)]
pub enum SanMatch {
    /// Equal (for DNS SANs, with the wildcard rules of RFC 6125).
    Exact(String),
    /// Starts with.
    Prefix(String),
    /// Ends with.
    Suffix(String),
    /// Contains.
    Contains(String),
    /// The whole SAN matches the regular expression.
    Regex(Pattern),
}

/// One entry of `match_subject_alt_names`.
#[derive(Debug, Clone, PartialEq)]
pub struct SanMatcher {
    /// What must hold.
    pub matcher: SanMatch,
    /// Compare case-insensitively (not with `Regex`).
    pub ignore_case: bool,
}

/// A cluster's TLS as gRFC A29 has the channel apply it.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamTls {
    /// Where the roots a server's chain must end in come from.
    pub roots: Roots,
    /// Where the client's certificate and key come from (mTLS), if any.
    pub identity: Option<ProviderInstance>,
    /// A server certificate must have a SAN matching one of these; any
    /// certificate that chains to the roots when empty.
    pub san_matchers: Vec<SanMatcher>,
}

impl UpstreamTls {
    /// The system's roots (gRFC A82) with no SAN matcher: any certificate
    /// from any publicly trusted CA is accepted for every endpoint. A82
    /// allows it and C-core accepts it silently; it is almost never meant.
    pub fn trusts_any_public_certificate(&self) -> bool {
        self.roots == Roots::System && self.san_matchers.is_empty()
    }
}

/// Where a cluster's roots come from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Roots {
    /// A bootstrap certificate provider instance.
    Provider(ProviderInstance),
    /// The system's roots (gRFC A82's `system_root_certs`).
    System,
}

/// The TLS a cluster asks for; `None` without a `transport_socket`.
pub(crate) fn upstream_tls(c: &mut Check, cluster: &cpb::Cluster) -> Option<UpstreamTls> {
    if !cluster.transport_socket_matches.is_empty() {
        c.fail_at("transport_socket_matches", "is not supported");
    }
    let socket = cluster.transport_socket.as_ref()?;
    c.at("transport_socket", |c| {
        let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
            c.fail_at("typed_config", "field not present");
            return None;
        };
        let context: tls::UpstreamTlsContext = c.at("typed_config", |c| c.unpack(any))?;
        c.at("typed_config", |c| {
            let common = context.common_tls_context.unwrap_or_default();
            c.at("common_tls_context", |c| common_tls(c, &common))
        })
    })
}

/// The deprecated instance message has the same fields as the current one.
fn deprecated(
    i: &tls::common_tls_context::CertificateProviderInstance,
) -> tls::CertificateProviderPluginInstance {
    tls::CertificateProviderPluginInstance {
        instance_name: i.instance_name.clone(),
        certificate_name: i.certificate_name.clone(),
    }
}

fn provider(c: &mut Check, i: &tls::CertificateProviderPluginInstance) -> Option<ProviderInstance> {
    if !c.options().certificate_providers.contains(&i.instance_name) {
        c.at("instance_name", |c| {
            c.fail_value(
                &i.instance_name,
                "is not a certificate provider instance of the bootstrap",
            )
        });
        return None;
    }
    Some(ProviderInstance {
        instance_name: i.instance_name.clone(),
        certificate_name: i.certificate_name.clone(),
    })
}

#[allow(deprecated)]
fn common_tls(c: &mut Check, t: &tls::CommonTlsContext) -> Option<UpstreamTls> {
    let mut ok = true;
    let mut roots = None;
    let mut system = false;
    let mut san_matchers = Vec::new();
    match &t.validation_context_type {
        Some(V::ValidationContext(v)) => {
            c.at("validation_context", |c| {
                ok &= validation_context(c, v, &mut roots, &mut system, &mut san_matchers);
            });
        }
        Some(V::CombinedValidationContext(combined)) => c.at("combined_validation_context", |c| {
            if let Some(v) = &combined.default_validation_context {
                c.at("default_validation_context", |c| {
                    ok &= validation_context(c, v, &mut roots, &mut system, &mut san_matchers);
                });
            }
            if roots.is_none() {
                if let Some(i) = &combined.validation_context_certificate_provider_instance {
                    roots = c.at("validation_context_certificate_provider_instance", |c| {
                        provider(c, &deprecated(i))
                    });
                    ok &= roots.is_some();
                }
            }
        }),
        Some(V::ValidationContextCertificateProviderInstance(i)) => {
            roots = c.at("validation_context_certificate_provider_instance", |c| {
                provider(c, &deprecated(i))
            });
            ok &= roots.is_some();
        }
        Some(V::ValidationContextSdsSecretConfig(_)) => {
            c.fail_at("validation_context_sds_secret_config", "is not supported");
            ok = false;
        }
        Some(V::ValidationContextCertificateProvider(_)) => {
            c.fail_at(
                "validation_context_certificate_provider",
                "is not supported",
            );
            ok = false;
        }
        None => {}
    }
    let identity = if let Some(i) = &t.tls_certificate_provider_instance {
        let p = c.at("tls_certificate_provider_instance", |c| provider(c, i));
        ok &= p.is_some();
        p
    } else if let Some(i) = &t.tls_certificate_certificate_provider_instance {
        let p = c.at("tls_certificate_certificate_provider_instance", |c| {
            provider(c, &deprecated(i))
        });
        ok &= p.is_some();
        p
    } else {
        if !t.tls_certificates.is_empty() {
            c.fail_at(
                "tls_certificates",
                "is not supported (certificates come from a provider instance)",
            );
            ok = false;
        }
        if !t.tls_certificate_sds_secret_configs.is_empty() {
            c.fail_at("tls_certificate_sds_secret_configs", "is not supported");
            ok = false;
        }
        None
    };
    if t.tls_certificate_certificate_provider.is_some() {
        c.fail_at("tls_certificate_certificate_provider", "is not supported");
        ok = false;
    }
    if t.tls_params.is_some() {
        c.fail_at("tls_params", "is not supported");
        ok = false;
    }
    if t.custom_handshaker.is_some() {
        c.fail_at("custom_handshaker", "is not supported");
        ok = false;
    }
    let roots = match (roots, system) {
        (Some(p), _) => Some(Roots::Provider(p)),
        (None, true) => Some(Roots::System),
        (None, false) => None,
    };
    let Some(roots) = roots else {
        if ok {
            c.fail("no CA certificate provider instance configured");
        }
        return None;
    };
    ok.then_some(UpstreamTls {
        roots,
        identity,
        san_matchers,
    })
}

/// Reads a `CertificateValidationContext`; whether it is acceptable.
#[allow(deprecated)]
fn validation_context(
    c: &mut Check,
    v: &tls::CertificateValidationContext,
    roots: &mut Option<ProviderInstance>,
    system: &mut bool,
    san_matchers: &mut Vec<SanMatcher>,
) -> bool {
    let mut ok = true;
    let matchers = c.each(
        "match_subject_alt_names",
        &v.match_subject_alt_names,
        san_matcher,
    );
    ok &= matchers.len() == v.match_subject_alt_names.len();
    *san_matchers = matchers;
    if let Some(i) = &v.ca_certificate_provider_instance {
        *roots = c.at("ca_certificate_provider_instance", |c| provider(c, i));
        ok &= roots.is_some();
    }
    // A82: the system's roots, when no provider names them.
    *system = roots.is_none() && v.system_root_certs.is_some();
    // C-core reads neither an inline `trusted_ca` nor typed SAN matchers:
    // they are ignored (the roots must then come from a provider).
    let refused: [(&str, bool); 5] = [
        (
            "verify_certificate_spki",
            !v.verify_certificate_spki.is_empty(),
        ),
        (
            "verify_certificate_hash",
            !v.verify_certificate_hash.is_empty(),
        ),
        (
            "require_signed_certificate_timestamp",
            v.require_signed_certificate_timestamp
                .as_ref()
                .is_some_and(|b| b.value),
        ),
        ("crl", v.crl.is_some()),
        (
            "custom_validator_config",
            v.custom_validator_config.is_some(),
        ),
    ];
    for (field, set) in refused {
        if set {
            c.fail_at(field, "is not supported");
            ok = false;
        }
    }
    ok
}

fn san_matcher(c: &mut Check, m: &mpb::StringMatcher) -> Option<SanMatcher> {
    use mpb::string_matcher::MatchPattern as M;
    // Envoy's proto validation (min_len 1) rejects an empty string: every
    // SAN starts with, ends with and contains "", so it would match any
    // certificate that chains.
    let text = |c: &mut Check, field: &str, v: &str| {
        if v.is_empty() {
            c.fail_at(field, "is empty (it would match every SAN)");
            return None;
        }
        Some(v.to_owned())
    };
    let matcher = match &m.match_pattern {
        Some(M::Exact(v)) => SanMatch::Exact(text(c, "exact", v)?),
        Some(M::Prefix(v)) => SanMatch::Prefix(text(c, "prefix", v)?),
        Some(M::Suffix(v)) => SanMatch::Suffix(text(c, "suffix", v)?),
        Some(M::Contains(v)) => SanMatch::Contains(text(c, "contains", v)?),
        Some(M::SafeRegex(r)) => {
            if m.ignore_case {
                c.fail_at("ignore_case", "is not supported with safe_regex");
                return None;
            }
            SanMatch::Regex(c.at("safe_regex", |c| Pattern::new(c, r))?)
        }
        Some(M::Custom(_)) => return c.unsupported("custom"),
        None => {
            c.fail("match_pattern: field not present");
            return None;
        }
    };
    Some(SanMatcher {
        matcher,
        ignore_case: m.ignore_case,
    })
}
