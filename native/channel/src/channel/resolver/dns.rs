//! The DNS resolver, as gRPC C-core's (`dns_resolver_plugin` over its
//! polling resolver) behaves: the name's A and AAAA records through
//! hickory (the system's resolv.conf and hosts file, or the target's
//! `dns://SERVER/`), every address an endpoint of one cluster run by the
//! LB tree with the service config's policy.
//!
//! When it resolves: once at the start; then only when the LB tree asks
//! for it, which is when a subchannel loses or fails its connection
//! (IDLE or TRANSIENT_FAILURE), at most once per cooldown
//! (`grpc.dns_min_time_between_resolutions_ms`, 30 s by default, counted
//! from the start of the last resolution, as C-core's `PollingResolver`
//! counts it): a request within the cooldown runs when it ends, one made
//! while a resolution runs is dropped. No polling by TTL, as
//! C-core and grpc-go. A failed resolution is retried with gRPC's backoff
//! (1 s × 1.6 up to 120 s); it fails calls (UNAVAILABLE, naming the name
//! and the DNS error) only while there never were addresses: later
//! failures keep the last addresses serving, as C-core's policies keep
//! their list on a resolver error.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::channel::config::{StaticConfig, StaticEndpoint};
use crate::channel::target::DnsName;
use crate::channel::work_serializer::Control;
use crate::xds::backoff::{Backoff, BackoffConfig};

/// C-core's `grpc.dns_min_time_between_resolutions_ms` default.
pub(crate) const DEFAULT_MIN_TIME_BETWEEN_RESOLUTIONS: Duration = Duration::from_secs(30);

/// A name's resolver: hickory's, asking the target's server or the
/// system's, its cache off (a re-resolution must see the change).
pub(crate) struct Dns {
    name: DnsName,
    resolver: TokioResolver,
    /// Whom it asks, for messages.
    servers: String,
    /// The cluster every answer becomes (policy, session); its endpoints
    /// are the answer's.
    template: StaticConfig,
    min_interval: Duration,
}

impl Dns {
    /// A resolver for `name`; the error says why hickory could not be
    /// set up (the system's resolv.conf unreadable).
    pub(crate) fn new(
        name: DnsName,
        template: StaticConfig,
        min_interval: Duration,
    ) -> Result<Dns, String> {
        let provider = TokioRuntimeProvider::default();
        let (mut builder, servers) = match name.server {
            None => {
                let b = TokioResolver::builder(provider)
                    .map_err(|e| format!("cannot read the system's DNS configuration: {e}"))?;
                (b, "the system's DNS servers".to_owned())
            }
            Some(server) => {
                let mut c = NameServerConfig::udp_and_tcp(server.ip());
                for conn in &mut c.connections {
                    conn.port = server.port();
                }
                let b = TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![c]),
                    provider,
                );
                (b, format!("DNS server {server}"))
            }
        };
        let opts = builder.options_mut();
        opts.cache_size = 0;
        if name.server.is_some() {
            // The target's server is the whole truth, as with c-ares.
            opts.use_hosts_file = ResolveHosts::Never;
        }
        let resolver = builder
            .build()
            .map_err(|e| format!("cannot start a DNS resolver: {e}"))?;
        Ok(Dns {
            name,
            resolver,
            servers,
            template,
            min_interval,
        })
    }

    /// The name's addresses, in the answer's order (A before AAAA), or
    /// why there are none.
    async fn resolve(&self) -> Result<Vec<SocketAddr>, String> {
        let host = self.name.host.as_str();
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.name.port)]);
        }
        let what = format!(
            "DNS resolution of {}:{} (asking {})",
            host, self.name.port, self.servers
        );
        let lookup = self
            .resolver
            .lookup_ip(host)
            .await
            .map_err(|e| format!("{what} failed: {e}"))?;
        let mut addresses: Vec<SocketAddr> = Vec::new();
        for ip in lookup.iter() {
            let a = SocketAddr::new(ip, self.name.port);
            if !addresses.contains(&a) {
                addresses.push(a);
            }
        }
        if addresses.is_empty() {
            return Err(format!("{what} failed: no A or AAAA record"));
        }
        Ok(addresses)
    }

    /// The config for `addresses`.
    fn config(&self, addresses: &[SocketAddr]) -> StaticConfig {
        let mut c = self.template.clone();
        c.endpoints = addresses.iter().copied().map(StaticEndpoint::new).collect();
        c
    }

    /// Resolves until the channel is gone: at the start, on each request
    /// of `reresolve` (after the cooldown), and after a failure with
    /// backoff.
    pub(crate) async fn run(self, control: mpsc::UnboundedSender<Control>, reresolve: Arc<Notify>) {
        let target = format!("{}:{}", self.name.host, self.name.port);
        let mut backoff = Backoff::new(BackoffConfig::default());
        let mut last: Option<Vec<SocketAddr>> = None;
        let mut failing: Option<String> = None;
        loop {
            let started = Instant::now();
            match self.resolve().await {
                Ok(addresses) => {
                    backoff.reset();
                    if failing.take().is_some() {
                        log::info!("{target}: DNS resolves again");
                    }
                    if last.as_ref() != Some(&addresses) {
                        log::info!(
                            "{target}: DNS: {}",
                            addresses
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        let resolved = self.config(&addresses).channel_config().map_err(|e| {
                            // A template the builder checked cannot fail here.
                            format!("{target}: {e}")
                        });
                        if control
                            .send(Control::Resolved(resolved.map(Box::new)))
                            .is_err()
                        {
                            return;
                        }
                        last = Some(addresses);
                    }
                    // A request made while this resolution ran is dropped, as
                    // C-core's polling resolver drops it: the answer is newer.
                    let _ = tokio::time::timeout(Duration::ZERO, reresolve.notified()).await;
                    // Until a connection is lost or fails, then the cooldown.
                    tokio::select! {
                        () = reresolve.notified() => {}
                        () = control.closed() => return,
                    }
                    let due = started + self.min_interval;
                    if due > Instant::now() {
                        log::debug!(
                            "{target}: re-resolution requested; due in {:?} (cooldown)",
                            due - Instant::now()
                        );
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = control.closed() => return,
                    }
                }
                Err(message) => {
                    if failing.as_ref() != Some(&message) {
                        if last.is_some() {
                            log::warn!("{message}; the last addresses stay in use");
                        } else if control
                            .send(Control::Resolved(Err(message.clone())))
                            .is_err()
                        {
                            return;
                        }
                        failing = Some(message);
                    }
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next_delay()) => {}
                        () = control.closed() => return,
                    }
                }
            }
        }
    }
}
