//! The `weighted_round_robin` policy: endpoints connected as `round_robin`
//! connects them ([`EndpointList`]), each with an [`EndpointWeight`] kept
//! while the endpoint stays in the config; a `weight_update_period` timer
//! rebuilds the current picker's scheduler from the weights; out-of-band
//! reporting streams ([`OobStream`]) run on the READY endpoints when the
//! config asks for them.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use super::picker::{ReadyEndpoint, SchedulerUpdate, WeightedRoundRobinPicker};
use super::weight::EndpointWeight;
use super::{Config, Settings};
use crate::lb::endpoint_list::EndpointList;
use crate::lb::{
    ConnectivityState, Ctx, Event, LbConfig, LbPolicy, PolicyStats, SharedPicker, SubchannelId,
    Timer,
};
use crate::orca::OobStream;
use crate::telemetry::WrrRecorder;

/// The `weighted_round_robin` policy.
#[derive(Debug)]
pub struct WeightedRoundRobin {
    /// The endpoints, each with its weight.
    endpoints: EndpointList<Arc<EndpointWeight>>,
    settings: Settings,
    /// The READY picker, whose scheduler the timer rebuilds.
    picker: Option<Arc<WeightedRoundRobinPicker>>,
    /// The next scheduler rebuild, while there is a READY picker.
    timer: Option<Timer>,
    /// Out-of-band streams by the READY subchannel they run on.
    oob: HashMap<SubchannelId, OobStream>,
    /// Records each scheduler rebuild (gRFC A78), when the channel does.
    metrics: Option<WrrRecorder>,
}

impl Default for WeightedRoundRobin {
    fn default() -> Self {
        WeightedRoundRobin::new()
    }
}

impl WeightedRoundRobin {
    /// A policy with no endpoints yet.
    pub fn new() -> Self {
        WeightedRoundRobin {
            endpoints: EndpointList::default(),
            settings: Settings::default(),
            picker: None,
            timer: None,
            oob: HashMap::new(),
            metrics: None,
        }
    }

    /// Recomputes state and picker after a change of the READY set (or of
    /// the config); returns whether either changed.
    fn refresh(&mut self, ctx: &mut Ctx<'_>, ready_changed: bool) -> bool {
        if ready_changed {
            self.follow_ready_set();
        }
        let settings = self.settings;
        let now = ctx.now();
        let mut built = None;
        let metrics = self.metrics.as_ref();
        let changed = self.endpoints.refresh(ready_changed, |endpoints| {
            let (picker, update) = WeightedRoundRobinPicker::new(
                endpoints
                    .iter()
                    .filter_map(|e| {
                        e.list.selected().map(|sc| ReadyEndpoint {
                            subchannel: sc.clone(),
                            weight: e.data.clone(),
                        })
                    })
                    .collect(),
                &settings,
                now,
            );
            record(metrics, &update);
            let picker = Arc::new(picker);
            built = Some(picker.clone());
            picker
        });
        if changed {
            self.picker = built;
            self.timer = self
                .picker
                .as_ref()
                .map(|_| ctx.timer(settings.weight_update_period));
        }
        changed
    }

    /// Tells each endpoint's weight whether it is READY (a reconnected
    /// endpoint waits out a new blackout, A58), and keeps one out-of-band
    /// stream per READY endpoint when the config asks for them.
    fn follow_ready_set(&mut self) {
        let mut keep: HashSet<SubchannelId> = HashSet::new();
        for e in self.endpoints.endpoints() {
            let selected = e.list.selected();
            e.data.set_ready(selected.is_some());
            let Some(sc) = selected.filter(|_| self.settings.enable_oob_load_report) else {
                continue;
            };
            keep.insert(sc.id());
            self.oob.entry(sc.id()).or_insert_with(|| {
                let weight = e.data.clone();
                OobStream::start(
                    sc.clone(),
                    self.settings.oob_reporting_period,
                    Arc::new(move |report| {
                        weight.report(report, tokio::time::Instant::now());
                    }),
                )
            });
        }
        // Dropping a stream ends it.
        self.oob.retain(|id, _| keep.contains(id));
    }

    /// The weight each READY endpoint's first address has now, for stats.
    fn weights_fact(&self, ctx_now: tokio::time::Instant) -> String {
        let s = &self.settings;
        self.endpoints
            .endpoints()
            .iter()
            .filter(|e| e.list.selected().is_some())
            .map(|e| {
                let first: Option<SocketAddr> = e.list.addresses().next();
                let w = e
                    .data
                    .weight(ctx_now, s.weight_expiration_period, s.blackout_period);
                format!(
                    "{}={w:.1}",
                    first.map_or_else(String::new, |a| a.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Records a scheduler rebuild, when the channel does.
fn record(metrics: Option<&WrrRecorder>, update: &SchedulerUpdate) {
    if let Some(m) = metrics {
        m.scheduler_update(
            &update.weights,
            update.not_yet_usable,
            update.stale,
            update.fallback,
        );
    }
}

impl LbPolicy for WeightedRoundRobin {
    fn update(&mut self, ctx: &mut Ctx<'_>, config: LbConfig) -> bool {
        let LbConfig::WeightedRoundRobin(config) = config else {
            return false;
        };
        let Config {
            endpoints,
            settings,
        } = config;
        let oob_changed = settings.enable_oob_load_report != self.settings.enable_oob_load_report
            || settings.oob_reporting_period != self.settings.oob_reporting_period;
        self.settings = settings;
        self.metrics = ctx.wrr_recorder();
        if oob_changed {
            // Streams restart with the new period (or stop).
            self.oob.clear();
        }
        let penalty = settings.error_utilization_penalty;
        // Endpoints that stay keep their weights, which take the new
        // penalty from their next report on.
        self.endpoints.update(
            ctx,
            endpoints
                .iter()
                .map(|e| e.addresses.as_slice())
                .filter(|a| !a.is_empty()),
            || Arc::new(EndpointWeight::new(penalty)),
        );
        for e in self.endpoints.endpoints() {
            e.data.set_error_utilization_penalty(penalty);
        }
        self.refresh(ctx, true)
    }

    fn event(&mut self, ctx: &mut Ctx<'_>, event: &Event) -> bool {
        if let Event::Timer(token) = *event {
            if self.timer.as_ref().is_some_and(|t| t.token() == token) {
                if let Some(picker) = &self.picker {
                    let update = picker.update_scheduler(&self.settings, ctx.now());
                    record(self.metrics.as_ref(), &update);
                    self.timer = Some(ctx.timer(self.settings.weight_update_period));
                }
                // The picker is the same; only its scheduler changed.
                return false;
            }
        }
        match self.endpoints.event(ctx, event) {
            Some(ready_changed) => self.refresh(ctx, ready_changed),
            None => false,
        }
    }

    fn state(&self) -> ConnectivityState {
        self.endpoints.state()
    }

    fn picker(&self) -> SharedPicker {
        self.endpoints.picker()
    }

    fn stats(&self) -> PolicyStats {
        let mut facts = vec![("ready".to_owned(), self.endpoints.ready_fact())];
        facts.push((
            "reports".to_owned(),
            if self.settings.enable_oob_load_report {
                format!("out-of-band every {:?}", self.settings.oob_reporting_period)
            } else {
                "per call".to_owned()
            },
        ));
        facts.push((
            "weights".to_owned(),
            self.weights_fact(tokio::time::Instant::now()),
        ));
        if let Some(scaled) = self.picker.as_ref().and_then(|p| p.scheduled_weights()) {
            let scaled: Vec<String> = scaled.iter().map(u16::to_string).collect();
            facts.push(("scheduled".to_owned(), scaled.join(" ")));
        } else {
            facts.push(("scheduled".to_owned(), "round robin".to_owned()));
        }
        PolicyStats {
            policy: "weighted_round_robin",
            name: None,
            state: self.state(),
            facts,
            endpoints: self.endpoints.subchannel_stats(),
            sessions: Vec::new(),
            children: Vec::new(),
        }
    }
}
