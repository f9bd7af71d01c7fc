//! Custom load-balancing policies (gRFC A52): a tether user implements
//! [`PolicyBuilder`] for their own [`LbPolicy`] and registers it in a
//! [`PolicyRegistry`] given to the channel
//! ([`ChannelBuilder::lb_policy_registry`](crate::channel::ChannelBuilder::lb_policy_registry)).
//!
//! A cluster selects it in its `load_balancing_policy` list with an
//! `xds.type.v3.TypedStruct` (or `udpa.type.v1.TypedStruct`) whose type
//! URL ends in the policy's name, its `value` being the policy's JSON
//! config: at the top of the list (the policy then gets every endpoint of
//! a priority) or as `xds_wrr_locality`'s endpoint-picking policy (one
//! instance per locality). As in gRPC, the first policy of the list the
//! channel knows wins: a name not registered is skipped, a registered
//! policy whose config its parser refuses NACKs the cluster with the
//! parser's message, and a list with nothing known NACKs it too.
//!
//! As in C-core, a TypedStruct may also name a built-in policy by its gRPC
//! name (`round_robin`, `pick_first`, `ring_hash_experimental`,
//! `weighted_round_robin`, `xds_wrr_locality_experimental`, and grpc-go's
//! `least_request_experimental`), its `value` then being that policy's
//! service-config JSON config; the LB tree's internal policies
//! ([`TREE_INTERNAL`]) NACK the cluster. Custom policies cannot take any
//! of these names ([`is_built_in`]).
//!
//! The policy runs on the LB task like the built-in ones: it gets
//! [`LbConfig::Custom`](super::LbConfig::Custom) with its endpoints and parsed config, subchannel
//! and timer events, and publishes pickers. `examples/weighted_random.rs`
//! is one, built on [`EndpointList`](super::EndpointList).

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::{EndpointAddresses, LbPolicy};

/// A parsed config, as the policy's builder made it; the policy downcasts
/// it to its own type.
pub type ParsedConfig = Arc<dyn Any + Send + Sync>;

/// What the registry knows of one custom policy.
pub trait PolicyBuilder: Send + Sync {
    /// The name configs select it by: the last part of the TypedStruct's
    /// type URL (e.g. `example.weighted_random` for
    /// `type.googleapis.com/example.weighted_random`).
    fn name(&self) -> &'static str;

    /// Validates the policy's config (the TypedStruct's `value` as a JSON
    /// object, `{}` when absent). An error NACKs the cluster, so it should
    /// name the field and the value.
    fn parse_config(&self, config: &serde_json::Value) -> Result<ParsedConfig, String>;

    /// A new instance, given its first config by an [`LbPolicy::update`]
    /// right after.
    fn build(&self) -> Box<dyn LbPolicy>;
}

/// The names of the built-in policies: tether's own, and gRPC's that
/// TypedStructs select them by. Custom policies cannot take these nor
/// [`TREE_INTERNAL`]'s ([`is_built_in`]).
pub const BUILT_IN: &[&str] = &[
    "round_robin",
    "pick_first",
    "least_request",
    "ring_hash",
    "weighted_round_robin",
    "xds_wrr_locality",
    "weighted_target",
    "priority",
    "outlier_detection",
    "xds_cluster_impl",
    "xds_override_host",
    "xds_cluster_manager",
    "cds",
    "ring_hash_experimental",
    "least_request_experimental",
    "xds_wrr_locality_experimental",
];

/// gRPC's names of the policies the xDS LB tree builds around a cluster's
/// policy. C-core's registry has them, so a TypedStruct naming one is
/// selected and its config parsed (an empty or partial one NACKs the
/// cluster); tether cannot run them as a cluster's policy and NACKs it
/// whatever the config.
pub const TREE_INTERNAL: &[&str] = &[
    "weighted_target_experimental",
    "priority_experimental",
    "outlier_detection_experimental",
    "xds_cluster_impl_experimental",
    "xds_override_host_experimental",
    "xds_cluster_manager_experimental",
    "cds_experimental",
];

/// Whether `name` is a built-in policy's ([`BUILT_IN`] or
/// [`TREE_INTERNAL`]).
pub fn is_built_in(name: &str) -> bool {
    BUILT_IN.contains(&name) || TREE_INTERNAL.contains(&name)
}

/// Whether `name` can name a policy: not empty, and only letters, digits,
/// `_`, `.` and `-`, as gRPC's policy names are.
pub fn is_valid_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    !name.is_empty() && name.chars().all(allowed)
}

/// Why a policy could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// The name is a built-in policy's.
    BuiltIn(String),
    /// Another custom policy has the name.
    Taken(String),
    /// The name is empty or has characters other than letters, digits,
    /// `_`, `.` and `-`.
    BadName(String),
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryError::BuiltIn(n) => write!(f, "policy name {n:?} is a built-in policy's"),
            RegistryError::Taken(n) => write!(f, "policy name {n:?} is already registered"),
            RegistryError::BadName(n) => write!(
                f,
                "policy name {n:?} must be letters, digits, '_', '.' or '-'"
            ),
        }
    }
}

impl std::error::Error for RegistryError {}

/// The custom policies a channel (its XdsClient's validation) knows.
/// Cloning shares them.
#[derive(Clone, Default)]
pub struct PolicyRegistry {
    builders: Arc<BTreeMap<&'static str, Arc<dyn PolicyBuilder>>>,
}

impl PolicyRegistry {
    /// No custom policies.
    pub fn new() -> Self {
        PolicyRegistry::default()
    }

    /// This registry with `builder` added.
    pub fn with(mut self, builder: impl PolicyBuilder + 'static) -> Result<Self, RegistryError> {
        let name = builder.name();
        if !is_valid_name(name) {
            return Err(RegistryError::BadName(name.to_owned()));
        }
        if is_built_in(name) {
            return Err(RegistryError::BuiltIn(name.to_owned()));
        }
        if self.builders.contains_key(name) {
            return Err(RegistryError::Taken(name.to_owned()));
        }
        Arc::make_mut(&mut self.builders).insert(name, Arc::new(builder));
        Ok(self)
    }

    /// The policy registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn PolicyBuilder>> {
        self.builders.get(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.builders.keys().copied()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.builders.is_empty()
    }
}

impl fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// Registries are equal when they register the same names (validation
/// options compare this way).
impl PartialEq for PolicyRegistry {
    fn eq(&self, other: &Self) -> bool {
        self.names().eq(other.names())
    }
}

impl Eq for PolicyRegistry {}

/// A cluster's custom policy as validation found it: its builder, its
/// config as written and as parsed.
#[derive(Clone)]
pub struct CustomPolicy {
    builder: Arc<dyn PolicyBuilder>,
    /// The config as the cluster wrote it.
    pub config: serde_json::Value,
    /// The config as the builder parsed it.
    pub parsed: ParsedConfig,
}

impl CustomPolicy {
    /// `builder`'s policy with `config`, parsed by it.
    pub fn parse(
        builder: &Arc<dyn PolicyBuilder>,
        config: serde_json::Value,
    ) -> Result<Self, String> {
        let parsed = builder.parse_config(&config)?;
        Ok(CustomPolicy {
            builder: builder.clone(),
            config,
            parsed,
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.builder.name()
    }

    /// A new instance of the policy.
    pub fn build(&self) -> Box<dyn LbPolicy> {
        self.builder.build()
    }
}

impl fmt::Debug for CustomPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomPolicy")
            .field("name", &self.name())
            .field("config", &self.config)
            .finish()
    }
}

/// Equal when the same policy has the same config as written.
impl PartialEq for CustomPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name() && self.config == other.config
    }
}

/// A custom policy's config in the tree: its endpoints and its config.
#[derive(Debug, Clone, PartialEq)]
pub struct CustomConfig {
    /// The endpoints (a locality's, or a priority's).
    pub endpoints: Vec<EndpointAddresses>,
    /// The policy and its config.
    pub policy: CustomPolicy,
}

impl CustomConfig {
    /// The parsed config as the policy's own type, if it is that type.
    pub fn parsed<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.policy.parsed.downcast_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::round_robin::RoundRobin;

    struct Named(&'static str);

    impl PolicyBuilder for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn parse_config(&self, config: &serde_json::Value) -> Result<ParsedConfig, String> {
            match config.get("n") {
                None => Ok(Arc::new(0u32)),
                Some(v) => v
                    .as_u64()
                    .map(|n| Arc::new(n as u32) as ParsedConfig)
                    .ok_or_else(|| format!("n: {v} is not a count")),
            }
        }
        fn build(&self) -> Box<dyn LbPolicy> {
            Box::new(RoundRobin::new())
        }
    }

    #[test]
    fn names_are_checked_and_unique() {
        let r = PolicyRegistry::new().with(Named("a.b-c_1")).unwrap();
        assert_eq!(r.names().collect::<Vec<_>>(), ["a.b-c_1"]);
        assert_eq!(
            r.clone().with(Named("a.b-c_1")).unwrap_err().to_string(),
            "policy name \"a.b-c_1\" is already registered"
        );
        assert_eq!(
            r.clone().with(Named("round_robin")).unwrap_err(),
            RegistryError::BuiltIn("round_robin".into())
        );
        assert_eq!(
            r.clone().with(Named("a/b")).unwrap_err(),
            RegistryError::BadName("a/b".into())
        );
        assert_eq!(
            r.clone().with(Named("")).unwrap_err(),
            RegistryError::BadName(String::new())
        );
        assert!(PolicyRegistry::new().is_empty());
        // gRPC's names are taken too, the tree's internal ones included.
        for name in ["ring_hash_experimental", "priority_experimental"] {
            assert_eq!(
                r.clone().with(Named(name)).unwrap_err(),
                RegistryError::BuiltIn(name.into())
            );
        }
        assert_eq!(format!("{r:?}"), "[\"a.b-c_1\"]");
    }

    #[test]
    fn configs_are_parsed_by_their_builder() {
        let r = PolicyRegistry::new().with(Named("p")).unwrap();
        let b = r.get("p").unwrap();
        let p = CustomPolicy::parse(b, serde_json::json!({"n": 3})).unwrap();
        let c = CustomConfig {
            endpoints: Vec::new(),
            policy: p.clone(),
        };
        assert_eq!(c.parsed::<u32>(), Some(&3));
        assert_eq!(c.parsed::<String>(), None);
        assert_eq!(p.name(), "p");
        assert_eq!(
            CustomPolicy::parse(b, serde_json::json!({"n": "x"})).unwrap_err(),
            "n: \"x\" is not a count"
        );
        assert_ne!(
            p,
            CustomPolicy::parse(b, serde_json::json!({"n": 4})).unwrap()
        );
    }
}
