//! The names and configs of custom load-balancing policies (gRFC A52), as
//! validation needs them: which names are gRPC's own, which a policy may
//! take, and a [`ParserRegistry`] of the config parsers a client knows.
//! The policies themselves live in the channel (`tether::lb::registry`),
//! which registers a parser here for each policy it can build.
//!
//! A cluster selects a policy in its `load_balancing_policy` list with an
//! `xds.type.v3.TypedStruct` (or `udpa.type.v1.TypedStruct`) whose type
//! URL ends in the policy's name, its `value` being the policy's JSON
//! config. As in gRPC, the first policy of the list the client knows wins:
//! a name not registered is skipped, a registered policy whose config its
//! parser refuses NACKs the cluster with the parser's message, and a list
//! with nothing known NACKs it too. A TypedStruct may also name a built-in
//! policy by its gRPC name ([`BUILT_IN`]); the LB tree's internal policies
//! ([`TREE_INTERNAL`]) NACK the cluster.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A parsed config, as the policy's parser made it; the policy downcasts
/// it to its own type.
pub type ParsedConfig = Arc<dyn Any + Send + Sync>;

/// What validation knows of one custom policy: its name and how to read
/// its config.
pub trait ConfigParser: Any + Send + Sync {
    /// The name configs select it by: the last part of the TypedStruct's
    /// type URL (e.g. `example.weighted_random` for
    /// `type.googleapis.com/example.weighted_random`).
    fn name(&self) -> &'static str;

    /// Validates the policy's config (the TypedStruct's `value` as a JSON
    /// object, `{}` when absent). An error NACKs the cluster, so it should
    /// name the field and the value.
    fn parse_config(&self, config: &serde_json::Value) -> Result<ParsedConfig, String>;
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
#[non_exhaustive]
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

/// The custom policies' parsers validation knows. Cloning shares them.
#[derive(Clone, Default)]
pub struct ParserRegistry {
    parsers: Arc<BTreeMap<&'static str, Arc<dyn ConfigParser>>>,
}

impl ParserRegistry {
    /// No custom policies.
    pub fn new() -> Self {
        ParserRegistry::default()
    }

    /// This registry with `parser` added: its name must be valid
    /// ([`is_valid_name`]), not a built-in policy's, and not taken.
    pub fn with(mut self, parser: Arc<dyn ConfigParser>) -> Result<Self, RegistryError> {
        let name = parser.name();
        if !is_valid_name(name) {
            return Err(RegistryError::BadName(name.to_owned()));
        }
        if is_built_in(name) {
            return Err(RegistryError::BuiltIn(name.to_owned()));
        }
        if self.parsers.contains_key(name) {
            return Err(RegistryError::Taken(name.to_owned()));
        }
        Arc::make_mut(&mut self.parsers).insert(name, parser);
        Ok(self)
    }

    /// The parser registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn ConfigParser>> {
        self.parsers.get(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.parsers.keys().copied()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.parsers.is_empty()
    }
}

impl fmt::Debug for ParserRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

/// Registries are equal when they register the same names (validation
/// options compare this way).
impl PartialEq for ParserRegistry {
    fn eq(&self, other: &Self) -> bool {
        self.names().eq(other.names())
    }
}

impl Eq for ParserRegistry {}

/// A cluster's custom policy as validation found it: its parser, its
/// config as written and as parsed.
#[derive(Clone)]
pub struct CustomPolicy {
    parser: Arc<dyn ConfigParser>,
    /// The config as the cluster wrote it.
    pub config: serde_json::Value,
    /// The config as the parser made it.
    pub parsed: ParsedConfig,
}

impl CustomPolicy {
    /// `parser`'s policy with `config`, parsed by it.
    pub fn parse(
        parser: &Arc<dyn ConfigParser>,
        config: serde_json::Value,
    ) -> Result<Self, String> {
        let parsed = parser.parse_config(&config)?;
        Ok(CustomPolicy {
            parser: parser.clone(),
            config,
            parsed,
        })
    }

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        self.parser.name()
    }

    /// The parser that read the config, as registered (the channel finds
    /// its policy's builder through it).
    pub fn parser(&self) -> &Arc<dyn ConfigParser> {
        &self.parser
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

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);

    impl ConfigParser for Named {
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
    }

    fn named(name: &'static str) -> Arc<dyn ConfigParser> {
        Arc::new(Named(name))
    }

    #[test]
    fn names_are_checked_and_unique() {
        let r = ParserRegistry::new().with(named("a.b-c_1")).unwrap();
        assert_eq!(r.names().collect::<Vec<_>>(), ["a.b-c_1"]);
        assert_eq!(
            r.clone().with(named("a.b-c_1")).unwrap_err().to_string(),
            "policy name \"a.b-c_1\" is already registered"
        );
        assert_eq!(
            r.clone().with(named("round_robin")).unwrap_err(),
            RegistryError::BuiltIn("round_robin".into())
        );
        assert_eq!(
            r.clone().with(named("a/b")).unwrap_err(),
            RegistryError::BadName("a/b".into())
        );
        assert_eq!(
            r.clone().with(named("")).unwrap_err(),
            RegistryError::BadName(String::new())
        );
        assert!(ParserRegistry::new().is_empty());
        // gRPC's names are taken too, the tree's internal ones included.
        for name in ["ring_hash_experimental", "priority_experimental"] {
            assert_eq!(
                r.clone().with(named(name)).unwrap_err(),
                RegistryError::BuiltIn(name.into())
            );
        }
        assert_eq!(format!("{r:?}"), "[\"a.b-c_1\"]");
    }

    #[test]
    fn configs_are_parsed_by_their_parser() {
        let r = ParserRegistry::new().with(named("p")).unwrap();
        let b = r.get("p").unwrap();
        let p = CustomPolicy::parse(b, serde_json::json!({"n": 3})).unwrap();
        assert_eq!(p.parsed.downcast_ref::<u32>(), Some(&3));
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
