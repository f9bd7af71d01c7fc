//! `priority` (gRFC A56): failover between a cluster's priorities, and for
//! an aggregate cluster between its underlying clusters (A75).
//!
//! The chosen child is the first, in priority order, that is READY or IDLE,
//! or still within its failover timer (10 s from its creation, or from
//! leaving READY/IDLE for CONNECTING); failing that, the first CONNECTING
//! one; failing that, the last. A child in TRANSIENT_FAILURE, or whose timer
//! fired before it connected, makes the next priority start. When a higher
//! priority becomes READY again it takes the traffic back, and the lower
//! ones are deactivated: kept for 15 minutes in case they are needed again,
//! then dropped.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::Duration;

use super::{
    queue_picker, Child, ConnectivityState, Ctx, Event, LbConfig, LbPolicy, PolicyStats,
    SharedPicker, Timer,
};

/// How long a new or reconnecting priority has before the next one starts.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a deactivated child is kept.
pub const RETENTION: Duration = Duration::from_secs(15 * 60);

/// `priority`'s config: its children in priority order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// `(name, config)` from the highest priority down; names are stable
    /// across updates so a child keeps its connections.
    pub children: Vec<(String, LbConfig)>,
}

struct ChildPriority {
    child: Child,
    failover: Option<Timer>,
    deactivation: Option<Timer>,
    /// READY or IDLE since the last TRANSIENT_FAILURE (restarts the
    /// failover timer when it drops to CONNECTING).
    seen_ready_or_idle: bool,
    /// The failover timer fired before the child connected.
    failed_over: bool,
}

impl ChildPriority {
    fn new(ctx: &mut Ctx<'_>, config: LbConfig) -> Self {
        let mut c = ChildPriority {
            child: Child::new(ctx, config),
            failover: Some(ctx.timer(FAILOVER_TIMEOUT)),
            deactivation: None,
            seen_ready_or_idle: false,
            failed_over: false,
        };
        c.note_state(ctx);
        c
    }

    /// The child's state as the choice sees it: a fired failover timer
    /// counts as TRANSIENT_FAILURE.
    fn effective_state(&self) -> ConnectivityState {
        let s = self.child.get().state();
        if self.failed_over && s == ConnectivityState::Connecting {
            ConnectivityState::TransientFailure
        } else {
            s
        }
    }

    /// Follows the child's state with the failover timer.
    fn note_state(&mut self, ctx: &mut Ctx<'_>) {
        match self.child.get().state() {
            ConnectivityState::Ready | ConnectivityState::Idle => {
                self.failover = None;
                self.failed_over = false;
                self.seen_ready_or_idle = true;
            }
            ConnectivityState::TransientFailure => {
                self.failover = None;
                self.seen_ready_or_idle = false;
            }
            ConnectivityState::Connecting => {
                if self.seen_ready_or_idle && self.failover.is_none() {
                    self.seen_ready_or_idle = false;
                    self.failed_over = false;
                    self.failover = Some(ctx.timer(FAILOVER_TIMEOUT));
                }
            }
        }
    }
}

/// The `priority` policy.
pub struct Priority {
    names: Vec<String>,
    configs: HashMap<String, LbConfig>,
    children: HashMap<String, ChildPriority>,
    current: Option<String>,
    state: ConnectivityState,
    picker: SharedPicker,
}

impl Default for Priority {
    fn default() -> Self {
        Priority::new()
    }
}

impl Priority {
    /// A policy with no priorities yet.
    pub fn new() -> Self {
        Priority {
            names: Vec::new(),
            configs: HashMap::new(),
            children: HashMap::new(),
            current: None,
            state: ConnectivityState::Connecting,
            picker: queue_picker(),
        }
    }

    /// The name of the priority in use.
    // Public with `internals` (for the benchmark); unused inside the crate.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    fn deactivate(ctx: &mut Ctx<'_>, child: &mut ChildPriority) {
        if child.deactivation.is_none() {
            child.deactivation = Some(ctx.timer(RETENTION));
            child.failover = None;
        }
    }

    /// A56's choice; returns whether the state or picker changed.
    fn choose(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.names.is_empty() {
            return self.set(ctx.target, None, ConnectivityState::TransientFailure, {
                super::fail_picker("priority policy has empty priority list")
            });
        }
        let mut chosen = None;
        for (i, name) in self.names.iter().enumerate() {
            let child = match self.children.entry(name.clone()) {
                Entry::Occupied(e) => {
                    let c = e.into_mut();
                    c.deactivation = None;
                    c
                }
                Entry::Vacant(e) => {
                    let Some(config) = self.configs.get(name) else {
                        continue;
                    };
                    log::debug!("{}: priority {name} starts", ctx.target);
                    e.insert(ChildPriority::new(ctx, config.clone()))
                }
            };
            match child.effective_state() {
                ConnectivityState::Ready | ConnectivityState::Idle => {
                    chosen = Some(i);
                    // Lower priorities are not needed while this one serves.
                    for lower in &self.names[i + 1..] {
                        if let Some(c) = self.children.get_mut(lower) {
                            Self::deactivate(ctx, c);
                        }
                    }
                    break;
                }
                _ if child.failover.is_some() => {
                    chosen = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let chosen = chosen
            .or_else(|| {
                self.names.iter().position(|n| {
                    self.children
                        .get(n)
                        .is_some_and(|c| c.effective_state() == ConnectivityState::Connecting)
                })
            })
            .unwrap_or(self.names.len() - 1);
        let name = self.names[chosen].clone();
        let child = &self.children[&name];
        let (state, picker) = (child.child.get().state(), child.child.get().picker());
        self.set(ctx.target, Some(name), state, picker)
    }

    fn set(
        &mut self,
        target: &str,
        current: Option<String>,
        state: ConnectivityState,
        picker: SharedPicker,
    ) -> bool {
        if current != self.current {
            log::info!(
                "{target}: priority: using {} ({state})",
                current.as_deref().unwrap_or("nothing")
            );
        }
        let changed = current != self.current
            || state != self.state
            || !std::sync::Arc::ptr_eq(&picker, &self.picker);
        self.current = current;
        self.state = state;
        self.picker = picker;
        changed
    }
}

impl LbPolicy for Priority {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::Priority(config) = config else {
            return false;
        };
        self.names = config.children.iter().map(|(n, _)| n.clone()).collect();
        self.configs = config.children.into_iter().collect();
        for (name, child) in &mut self.children {
            match self.configs.get(name) {
                Some(c) => {
                    child.child.update(ctx, c.clone());
                    child.note_state(ctx);
                }
                None => Self::deactivate(ctx, child),
            }
        }
        self.choose(ctx);
        true
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        let token = match *event {
            Event::Timer(token) => Some(token),
            _ => None,
        };
        let mut changed = false;
        let mut expired = None;
        for (name, child) in self.children.iter_mut() {
            let failover = child.failover.as_ref().map(Timer::token);
            let deactivation = child.deactivation.as_ref().map(Timer::token);
            if token.is_some() && token == failover {
                log::info!(
                    "{}: priority {name}: failover timer fired before it connected",
                    ctx.target
                );
                child.failover = None;
                child.failed_over = true;
                changed = true;
            } else if token.is_some() && token == deactivation {
                expired = Some(name.clone());
            } else if child.child.event(ctx, event) {
                child.note_state(ctx);
                changed = true;
            }
        }
        if let Some(name) = expired {
            log::debug!("{}: priority {name}: retention over, removed", ctx.target);
            self.children.remove(&name);
        }
        changed && self.choose(ctx)
    }

    fn state(&self) -> ConnectivityState {
        self.state
    }

    fn picker(&self) -> SharedPicker {
        self.picker.clone()
    }

    fn stats(&self) -> PolicyStats {
        let children: Vec<PolicyStats> = self
            .names
            .iter()
            .filter_map(|n| self.children.get(n).map(|c| (n, c)))
            .map(|(n, c)| {
                let mut s = c.child.get().stats();
                s.name = Some(n.clone());
                if c.deactivation.is_some() {
                    s.facts.push(("deactivated".to_owned(), "true".to_owned()));
                }
                s
            })
            .collect();
        PolicyStats {
            policy: "priority",
            name: None,
            state: self.state,
            facts: self
                .current
                .iter()
                .map(|c| ("current".to_owned(), c.clone()))
                .collect(),
            endpoints: Vec::new(),
            sessions: Vec::new(),
            children,
        }
    }
}
