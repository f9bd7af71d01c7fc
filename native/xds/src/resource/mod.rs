//! Validation of xDS resources into plain Rust structs, following gRPC's
//! rules: every problem is collected with the path of the field that holds
//! it, and a resource with any problem is NACKed.
//!
//! The structs here are what load balancing and `tether xds dump` consume.

pub mod cluster;
pub mod endpoint;
pub mod fault;
pub mod http_filter;
pub mod listener;
pub mod lrs_metrics;
pub mod retry;
pub mod route;
pub mod san;
pub mod security;
pub mod typed_struct;
mod weighted_round_robin;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::google::protobuf as pb;
use prost::{Message, Name};

pub use cluster::ClusterResource;
pub use endpoint::EndpointsResource;
pub use listener::ListenerResource;
pub use route::RouteConfigResource;

/// The four resource types of the ADS stream, in the order subscriptions are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// LDS: `envoy.config.listener.v3.Listener`.
    Listener,
    /// RDS: `envoy.config.route.v3.RouteConfiguration`.
    RouteConfiguration,
    /// CDS: `envoy.config.cluster.v3.Cluster`.
    Cluster,
    /// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
    Endpoints,
}

impl ResourceKind {
    /// All kinds, in subscription order.
    pub const ALL: [ResourceKind; 4] = [
        ResourceKind::Listener,
        ResourceKind::RouteConfiguration,
        ResourceKind::Cluster,
        ResourceKind::Endpoints,
    ];

    /// The type URL on the wire.
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceKind::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            ResourceKind::RouteConfiguration => {
                "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
            }
            ResourceKind::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            ResourceKind::Endpoints => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
        }
    }

    /// The kind of a type URL.
    pub fn from_type_url(url: &str) -> Option<Self> {
        ResourceKind::ALL.into_iter().find(|k| k.type_url() == url)
    }

    /// `Listener`, `RouteConfiguration`, `Cluster` or `ClusterLoadAssignment`.
    pub fn short_name(self) -> &'static str {
        match self {
            ResourceKind::Listener => "Listener",
            ResourceKind::RouteConfiguration => "RouteConfiguration",
            ResourceKind::Cluster => "Cluster",
            ResourceKind::Endpoints => "ClusterLoadAssignment",
        }
    }

    /// Whether a state-of-the-world response always carries every resource
    /// of this kind, so one left out has been deleted (LDS and CDS).
    pub fn all_in_each_response(self) -> bool {
        matches!(self, ResourceKind::Listener | ResourceKind::Cluster)
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// A validated resource of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Resource {
    /// A listener.
    Listener(Arc<ListenerResource>),
    /// A route configuration.
    RouteConfiguration(Arc<RouteConfigResource>),
    /// A cluster.
    Cluster(Arc<ClusterResource>),
    /// A cluster's endpoints.
    Endpoints(Arc<EndpointsResource>),
}

impl Resource {
    /// Which kind it is.
    pub fn kind(&self) -> ResourceKind {
        match self {
            Resource::Listener(_) => ResourceKind::Listener,
            Resource::RouteConfiguration(_) => ResourceKind::RouteConfiguration,
            Resource::Cluster(_) => ResourceKind::Cluster,
            Resource::Endpoints(_) => ResourceKind::Endpoints,
        }
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        match self {
            Resource::Listener(r) => &r.name,
            Resource::RouteConfiguration(r) => &r.name,
            Resource::Cluster(r) => &r.name,
            Resource::Endpoints(r) => &r.cluster_name,
        }
    }
}

/// One problem in a resource: the field's path, its value when useful, and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `virtual_hosts[0].routes[2].route.weighted_clusters`.
    pub field: String,
    /// The offending value as text (empty when the field is absent).
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}", self.field, self.problem)
        } else {
            write!(f, "{}: {} {}", self.field, self.value, self.problem)
        }
    }
}

/// Everything wrong with one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValidationError {
    /// Which kind of resource.
    pub kind: ResourceKind,
    /// Its name (empty when the resource could not even be decoded).
    pub name: String,
    /// The problems, in the order found.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}: ", self.kind, self.name)?;
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

/// What validation accepts beyond gRPC's rules. Everything is off by
/// default, so that tether NACKs what gRPC NACKs unless asked otherwise.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ValidationOptions {
    /// Accept clusters whose LB policy is MAGLEV (legacy `lb_policy` with
    /// `maglev_lb_config`, or the typed Maglev policy), which gRPC rejects;
    /// the channel runs them as `ring_hash` with a Maglev table.
    pub maglev: bool,
    /// Custom LB policies (gRFC A52) a cluster's `load_balancing_policy`
    /// may select by name; none by default.
    pub policies: crate::lb_config::registry::ParserRegistry,
    /// The bootstrap's certificate provider instance names: a cluster's
    /// TLS (A29) may name only these. The XdsClient fills it in from its
    /// bootstrap.
    pub certificate_providers: std::collections::BTreeSet<String>,
}

/// How a policy's config spells its fields: as the xDS proto does
/// (`minimum_ring_size`), or as gRPC's service-config JSON does
/// (`minRingSize`), which a TypedStruct's `value` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// The proto's snake_case names.
    Proto,
    /// The JSON config's camelCase names.
    Json,
}

impl Spelling {
    /// The field's name in this spelling.
    pub(crate) fn name(self, proto: &'static str, json: &'static str) -> &'static str {
        match self {
            Spelling::Proto => proto,
            Spelling::Json => json,
        }
    }
}

/// Collects field errors while walking a message; `at` pushes a path segment.
#[derive(Debug, Default)]
pub(crate) struct Check {
    path: Vec<String>,
    pub(crate) errors: Vec<FieldError>,
    options: ValidationOptions,
}

impl Check {
    /// A check that accepts what `options` allow.
    pub(crate) fn with_options(options: ValidationOptions) -> Self {
        Check {
            options,
            ..Check::default()
        }
    }

    /// What this validation accepts beyond gRPC's rules.
    pub(crate) fn options(&self) -> &ValidationOptions {
        &self.options
    }

    /// Runs `f` with `segment` (`name` or `[3]`) appended to the path.
    pub(crate) fn at<R>(&mut self, segment: &str, f: impl FnOnce(&mut Check) -> R) -> R {
        self.path.push(segment.to_owned());
        let r = f(self);
        self.path.pop();
        r
    }

    /// Runs `f` for element `i` of a list.
    pub(crate) fn index<R>(&mut self, i: usize, f: impl FnOnce(&mut Check) -> R) -> R {
        self.at(&format!("[{i}]"), f)
    }

    /// Validates each element of the list `field` with `f`, which records
    /// problems at `field[i]`; keeps the elements `f` accepts, in order.
    pub(crate) fn each<T, R>(
        &mut self,
        field: &str,
        items: &[T],
        mut f: impl FnMut(&mut Check, &T) -> Option<R>,
    ) -> Vec<R> {
        let mut out = Vec::with_capacity(items.len());
        self.at(field, |c| {
            for (i, item) in items.iter().enumerate() {
                c.index(i, |c| out.extend(f(c, item)));
            }
        });
        out
    }

    fn path(&self) -> String {
        let mut out = String::new();
        for s in &self.path {
            if !out.is_empty() && !s.starts_with('[') {
                out.push('.');
            }
            out.push_str(s);
        }
        out
    }

    /// The problems recorded so far.
    #[cfg(test)]
    pub(crate) fn errors(&self) -> &[FieldError] {
        &self.errors
    }

    /// Records a problem with the current field.
    pub(crate) fn fail(&mut self, problem: impl Into<String>) {
        let field = self.path();
        self.errors.push(FieldError {
            field,
            value: String::new(),
            problem: problem.into(),
        });
    }

    /// Records a problem with the current field's value.
    pub(crate) fn fail_value(&mut self, value: impl fmt::Debug, problem: impl Into<String>) {
        let field = self.path();
        self.errors.push(FieldError {
            field,
            value: format!("{value:?}"),
            problem: problem.into(),
        });
    }

    /// Records a problem with the named sub-field.
    pub(crate) fn fail_at(&mut self, segment: &str, problem: impl Into<String>) {
        self.at(segment, |c| c.fail(problem));
    }

    /// Records that the named sub-field is not supported and rejects the
    /// value holding it.
    pub(crate) fn unsupported<T>(&mut self, segment: &str) -> Option<T> {
        self.fail_at(segment, "is not supported");
        None
    }

    fn finish<T>(self, kind: ResourceKind, name: &str, value: T) -> Result<T, ValidationError> {
        if self.errors.is_empty() {
            Ok(value)
        } else {
            Err(ValidationError {
                kind,
                name: name.to_owned(),
                errors: self.errors,
            })
        }
    }

    /// Validates a `google.protobuf.Duration` the way gRPC does.
    pub(crate) fn duration(&mut self, d: &pb::Duration) -> Option<Duration> {
        let mut ok = true;
        if !(0..=315_576_000_000).contains(&d.seconds) {
            self.fail_at(
                "seconds",
                format!("{} is outside [0, 315576000000]", d.seconds),
            );
            ok = false;
        }
        if !(0..=999_999_999).contains(&d.nanos) {
            self.fail_at("nanos", format!("{} is outside [0, 999999999]", d.nanos));
            ok = false;
        }
        // Both are in range, so the casts are lossless.
        ok.then(|| Duration::new(d.seconds as u64, d.nanos as u32))
    }

    /// Decodes an `Any` holding `T`; records a problem when the type URL or
    /// the bytes are wrong.
    pub(crate) fn unpack<T: Message + Name + Default>(&mut self, any: &pb::Any) -> Option<T> {
        if any.type_url != T::type_url() {
            self.at("type_url", |c| {
                c.fail_value(&any.type_url, format!("is not {}", T::full_name()))
            });
            return None;
        }
        match T::decode(any.value.as_slice()) {
            Ok(m) => Some(m),
            Err(e) => {
                self.fail(format!("cannot be decoded as {}: {e}", T::full_name()));
                None
            }
        }
    }
}

/// The message type named by a type URL (the part after the last `/`).
pub(crate) fn type_name(type_url: &str) -> &str {
    type_url.rsplit('/').next().unwrap_or(type_url)
}

/// Packs a message into an `Any`.
pub fn pack<T: Message + Name>(msg: &T) -> pb::Any {
    pb::Any {
        type_url: T::type_url(),
        value: msg.encode_to_vec(),
    }
}

/// A resource of a response, decoded and validated.
#[derive(Debug)]
pub struct Decoded {
    /// The resource's name if it could be read, even from an invalid resource.
    pub name: Option<String>,
    /// The validated resource, or everything wrong with it.
    pub result: Result<Resource, ValidationError>,
}

/// Decodes and validates one resource of `kind` from a response by gRPC's
/// rules. A `envoy.service.discovery.v3.Resource` wrapper is unwrapped
/// first.
pub fn decode(kind: ResourceKind, any: &pb::Any) -> Decoded {
    decode_with(kind, any, ValidationOptions::default())
}

/// [`decode`], accepting what `options` allow beyond gRPC's rules.
pub fn decode_with(kind: ResourceKind, any: &pb::Any, options: ValidationOptions) -> Decoded {
    use envoy_types::pb::envoy::service::discovery::v3::Resource as Wrapper;
    let unwrapped;
    let any = if any.type_url == Wrapper::type_url() {
        match Wrapper::decode(any.value.as_slice()) {
            Ok(Wrapper {
                resource: Some(inner),
                ..
            }) => {
                unwrapped = inner;
                &unwrapped
            }
            _ => {
                return rejected(
                    kind,
                    "resource",
                    String::new(),
                    "is an envoy.service.discovery.v3.Resource without a resource",
                )
            }
        }
    } else {
        any
    };
    if any.type_url != kind.type_url() {
        return rejected(
            kind,
            "type_url",
            format!("{:?}", any.type_url),
            format!("does not match the response's type {}", kind.type_url()),
        );
    }
    let bytes = any.value.as_slice();
    let check = Check::with_options(options);
    match kind {
        ResourceKind::Listener => decode_as(
            kind,
            bytes,
            check,
            |m: &listener::Listener| &m.name,
            listener::validate,
            Resource::Listener,
        ),
        ResourceKind::RouteConfiguration => decode_as(
            kind,
            bytes,
            check,
            |m: &route::RouteConfiguration| &m.name,
            route::validate,
            Resource::RouteConfiguration,
        ),
        ResourceKind::Cluster => decode_as(
            kind,
            bytes,
            check,
            |m: &cluster::Cluster| &m.name,
            cluster::validate,
            Resource::Cluster,
        ),
        ResourceKind::Endpoints => decode_as(
            kind,
            bytes,
            check,
            |m: &endpoint::ClusterLoadAssignment| &m.cluster_name,
            endpoint::validate,
            Resource::Endpoints,
        ),
    }
}

/// Decodes `bytes` as the message `M` of `kind` and validates it with `c`; `name`
/// reads the resource's name (kept even when validation fails) and `wrap`
/// makes the validated value a [`Resource`].
fn decode_as<M: Message + Default, V>(
    kind: ResourceKind,
    bytes: &[u8],
    mut c: Check,
    name: fn(&M) -> &str,
    validate: fn(&mut Check, &M) -> V,
    wrap: fn(Arc<V>) -> Resource,
) -> Decoded {
    let m = match M::decode(bytes) {
        Ok(m) => m,
        Err(e) => {
            return rejected(
                kind,
                "(resource)",
                String::new(),
                format!("cannot be decoded: {e}"),
            )
        }
    };
    let name = name(&m).to_owned();
    let v = validate(&mut c, &m);
    Decoded {
        result: c.finish(kind, &name, v).map(|v| wrap(Arc::new(v))),
        name: Some(name),
    }
}

/// A resource rejected before it could be named: one problem with `field`.
fn rejected(kind: ResourceKind, field: &str, value: String, problem: impl Into<String>) -> Decoded {
    Decoded {
        name: None,
        result: Err(ValidationError {
            kind,
            name: String::new(),
            errors: vec![FieldError {
                field: field.into(),
                value,
                problem: problem.into(),
            }],
        }),
    }
}
