//! gRFC A94's subchannel instruments: connection attempts that succeeded
//! and failed, disconnections with why, and connections open, each with the
//! channel's `grpc.target` (a channel's subchannels are its own, so nothing
//! is counted twice). With the optional labels on, a subchannel records the
//! `grpc.lb.backend_service` and `grpc.lb.locality` of the LB subtree that
//! made it: a channel shares one subchannel among the clusters that list
//! its address with the same credentials (C-core makes one per cluster), so
//! the first one's are kept.

use std::sync::Arc;

use opentelemetry::metrics::{Counter, Meter, UpDownCounter};
use opentelemetry::KeyValue;

/// A94's instrument names.
pub(crate) const NAMES: [&str; 4] = [
    "grpc.subchannel.connection_attempts_succeeded",
    "grpc.subchannel.connection_attempts_failed",
    "grpc.subchannel.disconnections",
    "grpc.subchannel.open_connections",
];

/// The instruments, made when enabled.
#[derive(Debug)]
pub(crate) struct Instruments {
    succeeded: Counter<u64>,
    failed: Counter<u64>,
    disconnections: Counter<u64>,
    open: UpDownCounter<i64>,
}

impl Instruments {
    /// A94's instruments, if any is enabled (they go together).
    pub(crate) fn new(meter: &Meter, enabled: &[&'static str]) -> Option<Instruments> {
        if !NAMES.iter().any(|n| enabled.contains(n)) {
            return None;
        }
        Some(Instruments {
            succeeded: meter
                .u64_counter(NAMES[0])
                .with_unit("{attempt}")
                .with_description("Number of successful connection attempts.")
                .build(),
            failed: meter
                .u64_counter(NAMES[1])
                .with_unit("{attempt}")
                .with_description("Number of failed connection attempts.")
                .build(),
            disconnections: meter
                .u64_counter(NAMES[2])
                .with_unit("{disconnection}")
                .with_description("Number of times the selected subchannel becomes disconnected.")
                .build(),
            open: meter
                .i64_up_down_counter(NAMES[3])
                .with_unit("{connection}")
                .with_description("Number of open connections.")
                .build(),
        })
    }
}

/// What one channel's subchannels record: the instruments and its target.
#[derive(Debug)]
pub(crate) struct SubchannelMetrics {
    instruments: Arc<super::Instruments>,
    target: KeyValue,
}

impl SubchannelMetrics {
    /// For the channel whose `grpc.target` is `target`, if A94's
    /// instruments are enabled.
    pub(crate) fn new(
        instruments: Arc<super::Instruments>,
        target: KeyValue,
    ) -> Option<Arc<SubchannelMetrics>> {
        instruments.subchannel.as_ref()?;
        Some(Arc::new(SubchannelMetrics {
            instruments,
            target,
        }))
    }
}

impl crate::subchannel::ConnectionEventsFor for SubchannelMetrics {
    fn for_subchannel(
        &self,
        backend_service: Option<&Arc<str>>,
        locality: Option<&Arc<str>>,
    ) -> Arc<dyn crate::subchannel::ConnectionEvents> {
        let mut labels = vec![self.target.clone()];
        self.instruments
            .optional_labels
            .append(&mut labels, backend_service, locality);
        Arc::new(SubchannelEvents {
            instruments: self.instruments.clone(),
            labels,
        })
    }
}

/// One subchannel's listener: the instruments and its labels.
#[derive(Debug)]
struct SubchannelEvents {
    instruments: Arc<super::Instruments>,
    labels: Vec<KeyValue>,
}

impl SubchannelEvents {
    fn i(&self) -> Option<&Instruments> {
        self.instruments.subchannel.as_ref()
    }
}

impl crate::subchannel::ConnectionEvents for SubchannelEvents {
    fn attempt_failed(&self) {
        if let Some(i) = self.i() {
            i.failed.add(1, &self.labels);
        }
    }

    fn connected(&self) {
        let Some(i) = self.i() else { return };
        i.succeeded.add(1, &self.labels);
        i.open.add(1, &self.labels);
    }

    fn disconnected(&self, why: &'static str) {
        let Some(i) = self.i() else { return };
        i.open.add(-1, &self.labels);
        let mut labels = self.labels.clone();
        labels.push(KeyValue::new("grpc.disconnect_error", why));
        i.disconnections.add(1, &labels);
    }
}
