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
//! of these names ([`is_built_in`]). The names and the config parsing are
//! tether-xds's ([`tether_xds::lb_config::registry`]): validation runs there.
//!
//! The policy runs on the LB task like the built-in ones: it gets
//! [`LbConfig::Custom`](super::LbConfig::Custom) with its endpoints and parsed config, subchannel
//! and timer events, and publishes pickers. `examples/weighted_random.rs`
//! is one, built on [`EndpointList`](super::EndpointList).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use tether_xds::lb_config::registry::{
    is_built_in, is_valid_name, ConfigParser, CustomPolicy, ParsedConfig, ParserRegistry,
    RegistryError, BUILT_IN, TREE_INTERNAL,
};

use super::{EndpointAddresses, LbPolicy};

/// What the channel knows of one custom policy.
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

/// A builder as validation sees it: its name and parser. The LB tree finds
/// the builder again from a validated [`CustomPolicy`] ([`builder_of`]).
struct Registered(Arc<dyn PolicyBuilder>);

impl ConfigParser for Registered {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn parse_config(&self, config: &serde_json::Value) -> Result<ParsedConfig, String> {
        self.0.parse_config(config)
    }
}

/// The builder of a policy registered in a [`PolicyRegistry`]; `None` for
/// a parser registered with tether-xds alone.
pub fn builder_of(policy: &CustomPolicy) -> Option<&Arc<dyn PolicyBuilder>> {
    registered(policy.parser())
}

/// The builder behind a parser this registry made.
fn registered(parser: &Arc<dyn ConfigParser>) -> Option<&Arc<dyn PolicyBuilder>> {
    let parser: &dyn Any = parser.as_ref();
    parser.downcast_ref::<Registered>().map(|r| &r.0)
}

/// Stands in for a custom policy whose parser validation knew but the
/// channel has no builder for (a [`ParserRegistry`] filled by hand): its
/// calls fail, naming the policy. The cluster's `cds` refuses such a config
/// first ([`builder_of`]), so the tree only meets this if a config skips it.
pub(crate) struct Unbuildable(pub &'static str);

impl Unbuildable {
    fn message(&self) -> String {
        format!(
            "custom lb policy {:?} has no builder in the channel's policy registry",
            self.0
        )
    }
}

impl LbPolicy for Unbuildable {
    fn update(&mut self, _: &mut super::Ctx<'_>, _: super::LbConfig) -> bool {
        false
    }

    fn event(&mut self, _: &mut super::Ctx<'_>, _: &super::Event) -> bool {
        false
    }

    fn state(&self) -> super::ConnectivityState {
        super::ConnectivityState::TransientFailure
    }

    fn picker(&self) -> super::SharedPicker {
        super::fail_picker(self.message())
    }

    fn stats(&self) -> super::PolicyStats {
        super::PolicyStats {
            policy: self.0,
            name: None,
            state: self.state(),
            facts: vec![("error".into(), self.message())],
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}

/// `builder`'s policy with `config`, parsed by it, as validation makes it
/// for a cluster that selects it (for policies and tests that build
/// configs by hand).
pub fn custom_policy(
    builder: &Arc<dyn PolicyBuilder>,
    config: serde_json::Value,
) -> Result<CustomPolicy, String> {
    let parser: Arc<dyn ConfigParser> = Arc::new(Registered(builder.clone()));
    CustomPolicy::parse(&parser, config)
}

/// The custom policies a channel (its XdsClient's validation) knows.
/// Cloning shares them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PolicyRegistry {
    parsers: ParserRegistry,
}

impl PolicyRegistry {
    /// No custom policies.
    pub fn new() -> Self {
        PolicyRegistry::default()
    }

    /// This registry with `builder` added.
    pub fn with(self, builder: impl PolicyBuilder + 'static) -> Result<Self, RegistryError> {
        let parsers = self.parsers.with(Arc::new(Registered(Arc::new(builder))))?;
        Ok(PolicyRegistry { parsers })
    }

    /// The policy registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn PolicyBuilder>> {
        registered(self.parsers.get(name)?)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.parsers.names()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.parsers.is_empty()
    }

    /// The policies' parsers, for the XdsClient's validation.
    pub fn parsers(&self) -> &ParserRegistry {
        &self.parsers
    }
}

impl fmt::Debug for PolicyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.parsers.fmt(f)
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

    /// The name rules are tether-xds's (tested there); the channel's
    /// registry applies them to builders and finds each builder again.
    #[test]
    fn builders_follow_the_name_rules() {
        let r = PolicyRegistry::new().with(Named("a.b-c_1")).unwrap();
        assert_eq!(r.names().collect::<Vec<_>>(), ["a.b-c_1"]);
        assert_eq!(r.get("a.b-c_1").unwrap().name(), "a.b-c_1");
        assert!(r.get("other").is_none());
        assert_eq!(
            r.clone().with(Named("priority_experimental")).unwrap_err(),
            RegistryError::BuiltIn("priority_experimental".into())
        );
        assert_eq!(
            r.clone().with(Named("a.b-c_1")).unwrap_err(),
            RegistryError::Taken("a.b-c_1".into())
        );
        assert!(PolicyRegistry::new().is_empty());
        assert_eq!(format!("{r:?}"), "[\"a.b-c_1\"]");
    }

    #[test]
    fn configs_are_parsed_by_their_builder() {
        let r = PolicyRegistry::new().with(Named("p")).unwrap();
        let b = r.get("p").unwrap();
        let parser = r.parsers().get("p").unwrap();
        let p = CustomPolicy::parse(parser, serde_json::json!({"n": 3})).unwrap();
        assert!(Arc::ptr_eq(builder_of(&p).unwrap(), b));
        let c = CustomConfig {
            endpoints: Vec::new(),
            policy: p.clone(),
        };
        assert_eq!(c.parsed::<u32>(), Some(&3));
        assert_eq!(c.parsed::<String>(), None);
        assert_eq!(p.name(), "p");
        assert_eq!(
            CustomPolicy::parse(parser, serde_json::json!({"n": "x"})).unwrap_err(),
            "n: \"x\" is not a count"
        );
        assert_ne!(
            p,
            CustomPolicy::parse(parser, serde_json::json!({"n": 4})).unwrap()
        );
    }
}
