//! `weighted_target`: a child per target (for xDS, per locality), calls
//! spread over the READY children by weight.
//!
//! State by gRPC's rule ([`aggregate_state`]); a child in
//! TRANSIENT_FAILURE counts as failed until it is READY again. The picker
//! chooses at random by weight among the children in the aggregate state:
//! the READY ones, or in TRANSIENT_FAILURE the failing ones (whose pickers
//! say why); CONNECTING and IDLE queue.

mod picker;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{
    aggregate_state, queue_picker, Child, ConnectivityState, Ctx, Event, LbConfig, LbPolicy,
    PolicyStats, SharedPicker,
};
pub use picker::WeightedPicker;

/// One target: its weight (above zero) and its child policy's config.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Relative weight.
    pub weight: u32,
    /// The child's config.
    pub child: LbConfig,
}

/// `weighted_target`'s config: targets by name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// Targets keyed by name (for xDS, the locality).
    pub targets: BTreeMap<String, Target>,
}

struct Entry {
    weight: u32,
    child: Child,
    /// Sticky TRANSIENT_FAILURE: set on TF, cleared on READY.
    failing: bool,
}

impl Entry {
    fn state(&self) -> ConnectivityState {
        if self.failing {
            ConnectivityState::TransientFailure
        } else {
            self.child.get().state()
        }
    }
}

/// The `weighted_target` policy.
pub struct WeightedTarget {
    targets: BTreeMap<String, Entry>,
    state: ConnectivityState,
    picker: Option<SharedPicker>,
}

impl Default for WeightedTarget {
    fn default() -> Self {
        WeightedTarget::new()
    }
}

impl WeightedTarget {
    /// A policy with no targets yet.
    pub fn new() -> Self {
        WeightedTarget {
            targets: BTreeMap::new(),
            state: ConnectivityState::Connecting,
            picker: None,
        }
    }

    fn note_child_state(entry: &mut Entry) {
        match entry.child.get().state() {
            ConnectivityState::TransientFailure => entry.failing = true,
            ConnectivityState::Ready => entry.failing = false,
            _ => {}
        }
    }

    fn refresh(&mut self) -> bool {
        let state = aggregate_state(self.targets.values().map(Entry::state));
        let picker: SharedPicker = match state {
            ConnectivityState::Ready | ConnectivityState::TransientFailure => {
                let choices = self
                    .targets
                    .values()
                    .filter(|e| e.state() == state)
                    .map(|e| (e.weight, e.child.get().picker()))
                    .collect::<Vec<_>>();
                if choices.is_empty() {
                    super::fail_picker("weighted_target: no targets")
                } else {
                    Arc::new(WeightedPicker::new(choices))
                }
            }
            _ => queue_picker(),
        };
        self.state = state;
        self.picker = Some(picker);
        true
    }
}

impl WeightedTarget {
    /// A child that went IDLE is told to connect again at once, as C-core's
    /// weighted_target does (its localities' policies are not left waiting
    /// for a call that its picker would never give them).
    fn wake(ctx: &mut Ctx<'_>, entry: &mut Entry) {
        if entry.child.get().state() == ConnectivityState::Idle
            && entry.child.policy().exit_idle(ctx)
        {
            Self::note_child_state(entry);
        }
    }
}

impl LbPolicy for WeightedTarget {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::WeightedTarget(config) = config else {
            return false;
        };
        // Targets that left go at once: xDS never brings a locality back
        // under the same name soon enough for a retention timer to pay.
        self.targets
            .retain(|name, _| config.targets.contains_key(name));
        let outer = ctx.labels.locality.clone();
        let recording = ctx.records();
        for (name, target) in config.targets {
            // Its children's locality (A78's `grpc.lb.locality`), which
            // policies take when updated.
            if recording {
                ctx.labels.locality = Some(Arc::from(name.as_str()));
            }
            match self.targets.get_mut(&name) {
                Some(entry) => {
                    entry.weight = target.weight;
                    entry.child.update(ctx, target.child);
                    Self::note_child_state(entry);
                    Self::wake(ctx, entry);
                }
                None => {
                    let mut entry = Entry {
                        weight: target.weight,
                        child: Child::new(ctx, target.child),
                        failing: false,
                    };
                    Self::note_child_state(&mut entry);
                    Self::wake(ctx, &mut entry);
                    self.targets.insert(name, entry);
                }
            }
        }
        ctx.labels.locality = outer;
        self.refresh()
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let mut changed = false;
        for entry in self.targets.values_mut() {
            if entry.child.event(ctx, event) {
                Self::note_child_state(entry);
                Self::wake(ctx, entry);
                changed = true;
            }
        }
        changed && self.refresh()
    }

    fn state(&self) -> ConnectivityState {
        self.state
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone().unwrap_or_else(queue_picker)
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            policy: "weighted_target",
            name: None,
            state: self.state,
            facts: Vec::new(),
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children: self
                .targets
                .iter()
                .map(|(name, e)| {
                    let mut s = e.child.get().stats();
                    s.name = Some(name.clone());
                    s.facts.push(("weight".to_owned(), e.weight.to_string()));
                    s
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! weighted_target wakes an IDLE child, as C-core's does; the child is
    //! a fake policy that goes IDLE when told and counts the wake-ups.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::lb::registry::{custom_policy, ParsedConfig, PolicyBuilder};
    use crate::lb::test_harness::Harness;
    use crate::lb::{CustomConfig, PolicyStats};

    /// IDLE until woken (then CONNECTING); an update makes it IDLE again.
    struct Sleeper(Arc<AtomicUsize>, ConnectivityState);

    impl LbPolicy for Sleeper {
        fn update(&mut self, _: &mut Ctx<'_>, _: LbConfig) -> bool {
            self.1 = ConnectivityState::Idle;
            true
        }
        fn event(&mut self, _: &mut Ctx<'_>, _: &Event) -> bool {
            false
        }
        fn state(&self) -> ConnectivityState {
            self.1
        }
        fn picker(&self) -> SharedPicker {
            queue_picker()
        }
        fn stats(&self) -> PolicyStats {
            unimplemented!("not read here")
        }
        fn exit_idle(&mut self, _: &mut Ctx<'_>) -> bool {
            self.0.fetch_add(1, Ordering::SeqCst);
            self.1 = ConnectivityState::Connecting;
            true
        }
    }

    struct SleeperBuilder(Arc<AtomicUsize>);

    impl PolicyBuilder for SleeperBuilder {
        fn name(&self) -> &'static str {
            "test.sleeper"
        }
        fn parse_config(&self, _: &serde_json::Value) -> Result<ParsedConfig, String> {
            Ok(Arc::new(()))
        }
        fn build(&self) -> Box<dyn LbPolicy> {
            Box::new(Sleeper(self.0.clone(), ConnectivityState::Idle))
        }
    }

    #[tokio::test]
    async fn an_idle_child_is_told_to_connect() {
        let woken = Arc::new(AtomicUsize::new(0));
        let builder: Arc<dyn PolicyBuilder> = Arc::new(SleeperBuilder(woken.clone()));
        let config = |n: u32| {
            let child = LbConfig::Custom(CustomConfig {
                endpoints: Vec::new(),
                policy: custom_policy(&builder, serde_json::json!({ "n": n })).unwrap(),
            });
            LbConfig::WeightedTarget(Config {
                targets: [("a".to_owned(), Target { weight: 1, child })].into(),
            })
        };
        let mut h = Harness::new(WeightedTarget::new());
        // A new child that starts IDLE is woken at once.
        h.with(|p, ctx| p.update(ctx, config(1)));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert_eq!(h.policy.state(), ConnectivityState::Connecting);
        // So is one that an update leaves IDLE.
        h.with(|p, ctx| p.update(ctx, config(2)));
        assert_eq!(woken.load(Ordering::SeqCst), 2);
        assert_eq!(h.policy.state(), ConnectivityState::Connecting);
    }
}
