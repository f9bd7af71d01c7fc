//! `example.weighted_random`: a custom load-balancing policy (gRFC A52)
//! that sends each call to a READY endpoint drawn at random in proportion to
//! its EDS `load_balancing_weight` (what Envoy's RANDOM does, which gRPC's
//! built-in policies do not offer).
//!
//! Its config (the TypedStruct's `value`) has one optional field:
//! `ignoreEndpointWeights` (bool, default false): draw uniformly.
//!
//! It is built the way tether's own endpoint policies are: an
//! [`EndpointList`] connects every endpoint (pick_first over its addresses)
//! and tracks their states; the policy only says what it keeps per endpoint
//! (its weight) and what the READY picker is.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use tether::lb::{
    ConnectivityState, Ctx, EndpointList, Event, LbConfig, LbPolicy, ParsedConfig, Pick, PickArgs,
    PickResult, Picker, PolicyBuilder, PolicyStats, SharedPicker, Subchannel,
};

/// The name clusters select the policy by.
pub const NAME: &str = "example.weighted_random";

/// The parsed config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Config {
    /// Draw uniformly, ignoring the endpoints' weights.
    pub ignore_endpoint_weights: bool,
}

/// Registers the policy: `PolicyRegistry::new().with(Builder)`.
pub struct Builder;

impl PolicyBuilder for Builder {
    fn name(&self) -> &'static str {
        NAME
    }

    fn parse_config(&self, config: &serde_json::Value) -> Result<ParsedConfig, String> {
        let Some(fields) = config.as_object() else {
            return Err(format!("config {config} is not an object"));
        };
        let mut parsed = Config::default();
        for (key, value) in fields {
            match key.as_str() {
                "ignoreEndpointWeights" => {
                    parsed.ignore_endpoint_weights = value
                        .as_bool()
                        .ok_or_else(|| format!("ignoreEndpointWeights: {value} is not a bool"))?;
                }
                other => return Err(format!("{other}: unknown field")),
            }
        }
        Ok(Arc::new(parsed))
    }

    fn build(&self) -> Box<dyn LbPolicy> {
        Box::new(WeightedRandom::default())
    }
}

/// The policy: one per locality (or per priority), on the channel's LB task.
#[derive(Debug, Default)]
pub struct WeightedRandom {
    /// Each endpoint with its current weight (kept across config updates).
    endpoints: EndpointList<Arc<AtomicU32>>,
    config: Config,
}

impl WeightedRandom {
    fn refresh(&mut self, ready_changed: bool) -> bool {
        let uniform = self.config.ignore_endpoint_weights;
        self.endpoints.refresh(ready_changed, |endpoints| {
            let ready = endpoints.iter().filter_map(|e| {
                let weight = if uniform {
                    1
                } else {
                    e.data.load(Ordering::Relaxed).max(1)
                };
                e.list.selected().map(|sc| (sc.clone(), weight))
            });
            Arc::new(WeightedRandomPicker::new(ready))
        })
    }
}

impl LbPolicy for WeightedRandom {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::Custom(config) = config else {
            return false;
        };
        self.config = config.parsed::<Config>().copied().unwrap_or_default();
        self.endpoints.update(
            ctx,
            config
                .endpoints
                .iter()
                .map(|e| e.addresses.as_slice())
                .filter(|a| !a.is_empty()),
            || Arc::new(AtomicU32::new(1)),
        );
        // Weights may change while an endpoint stays: set them all.
        for e in self.endpoints.endpoints() {
            let first: Option<SocketAddr> = e.list.addresses().next();
            if let Some(c) = config
                .endpoints
                .iter()
                .find(|c| c.addresses.first() == first.as_ref())
            {
                e.data.store(c.weight, Ordering::Relaxed);
            }
        }
        self.refresh(true)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        self.endpoints
            .event(ctx, event)
            .is_some_and(|ready_changed| self.refresh(ready_changed))
    }

    fn state(&self) -> ConnectivityState {
        self.endpoints.state()
    }

    fn picker(&self) -> SharedPicker {
        self.endpoints.picker()
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: NAME,
            name: None,
            state: self.state(),
            facts: vec![("ready".to_owned(), self.endpoints.ready_fact())],
            endpoints: self.endpoints.subchannel_stats(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}

/// Picks a READY endpoint with probability weight / total; never empty.
#[derive(Debug)]
struct WeightedRandomPicker {
    /// READY subchannels with the running sum of weights up to each.
    ready: Vec<(Subchannel, u64)>,
    total: u64,
    /// Draws: a counter hashed with a per-picker random key.
    counter: AtomicU64,
    hasher: RandomState,
}

impl WeightedRandomPicker {
    fn new(ready: impl Iterator<Item = (Subchannel, u32)>) -> Self {
        let mut total = 0u64;
        let ready = ready
            .map(|(sc, w)| {
                total += u64::from(w);
                (sc, total)
            })
            .collect();
        WeightedRandomPicker {
            ready,
            total,
            counter: AtomicU64::new(0),
            hasher: RandomState::new(),
        }
    }
}

impl Picker for WeightedRandomPicker {
    fn pick(&self, _: &PickArgs<'_>) -> PickResult {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let draw = self.hasher.hash_one(n) % self.total.max(1);
        // The first endpoint whose running sum exceeds the draw.
        let i = self.ready.partition_point(|&(_, upto)| upto <= draw);
        let (sc, _) = &self.ready[i.min(self.ready.len() - 1)];
        PickResult::Complete(Pick::by(NAME, sc.clone()))
    }
}
