//! tether-control with many names: 1,000 services, each one DNS name of
//! 10 addresses, served from the in-process DNS server (testkit's, on
//! 127.0.0.1) and watched by one proxyless client (tether's XdsClient, every
//! ClusterLoadAssignment). Each round changes one name's answer and
//! measures, from the change:
//!
//! - until tether-control's resolver status shows the new answer (the
//!   refresh: the records' TTL, floored at `minRefresh`);
//! - until the client holds the new endpoints (refresh + push);
//! - the push alone (the difference), and which resources the client got
//!   anew: only the changed name's ClusterLoadAssignment should be.
//!
//! `cargo bench -p tether-control --bench dns [-- --names N --rounds R]`
//! prints one table. Every wait is bounded; the figures are medians and
//! maxima over the rounds.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tether_control::{Reload, Reloader};
use tether_testkit::dns::DnsServer;
use tether_xds::bootstrap::Bootstrap;
use tether_xds::client::{ResourceState, Watcher, XdsClient};
use tether_xds::resource::{Resource, ResourceKind};

const ADDRESSES: u8 = 10;
const PORT: u16 = 9000;
const BOUND: Duration = Duration::from_secs(30);

fn name(i: usize) -> String {
    format!("svc-{i:04}.bench.tether.test")
}

/// Name `i`'s answer in `round`: 10 loopback addresses, all different from
/// the previous round's (never connected to: data only).
fn answer(i: usize, round: u8) -> Vec<IpAddr> {
    let (hi, lo) = ((i / 250) as u8 + 1, (i % 250) as u8);
    (0..ADDRESSES)
        .map(|k| IpAddr::V4(Ipv4Addr::new(127, hi, lo, 1 + k + (round % 20) * ADDRESSES)))
        .collect()
}

fn yaml(dns: SocketAddr, names: usize) -> String {
    let mut y = format!(
        "dns:\n  servers: [\"{dns}\"]\n  minRefresh: 1s\n  maxRefresh: 1s\n  drainOnRemoval: 0s\nservices:\n"
    );
    for i in 0..names {
        y.push_str(&format!(
            "  - name: svc-{i}\n    endpoints:\n      - address: {}:{PORT}\n",
            name(i)
        ));
    }
    y
}

fn arg(flag: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn addresses(state: &ResourceState) -> Vec<IpAddr> {
    match &state.resource {
        Some(Resource::Endpoints(eds)) => {
            let mut v: Vec<IpAddr> = eds
                .priorities
                .iter()
                .flat_map(|p| &p.localities)
                .flat_map(|l| &l.endpoints)
                .flat_map(|e| e.addresses.iter().map(|a| a.ip()))
                .collect();
            v.sort();
            v
        }
        _ => Vec::new(),
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let names = arg("--names", 1000);
    let rounds = arg("--rounds", 10).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        let dns = DnsServer::start().await;
        dns.set_ttl(1);
        for i in 0..names {
            dns.set(&name(i), &answer(i, 0));
        }
        let dir = std::env::temp_dir().join(format!("tether-bench-dns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a work folder");
        let path: PathBuf = dir.join("tether.yaml");
        std::fs::write(&path, yaml(dns.addr(), names)).expect("the file");
        let started = Instant::now();
        let p = path.clone();
        let (plane, reloader) = tokio::task::spawn_blocking(move || Reloader::start(&p))
            .await
            .expect("the start task")
            .unwrap_or_else(|e| panic!("tether-control refused the file: {e}"));
        let first = started.elapsed();
        let mut status = reloader.dns_status();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let addr = listener.local_addr().expect("its address");
        let served = plane.clone();
        tokio::spawn(async move { served.serve(listener, std::future::pending()).await });
        tokio::spawn(reloader.run(Duration::from_millis(200), |r| {
            if let Reload::Rejected(e) = r {
                eprintln!("rejected: {e}");
            }
        }));
        let client = XdsClient::start(
            Bootstrap::from_json(&format!(
                r#"{{"xds_servers":[{{"server_uri":"{addr}","channel_creds":[{{"type":"insecure"}}],"server_features":["xds_v3"]}}],"node":{{"id":"bench-dns"}}}}"#
            ))
            .expect("a bootstrap"),
        )
        .expect("an XdsClient");
        let mut watchers: Vec<Watcher> = (0..names)
            .map(|i| client.watch(ResourceKind::Endpoints, &format!("svc-{i}")))
            .collect();
        let subscribed = Instant::now();
        for w in &mut watchers {
            tokio::time::timeout(BOUND, w.wait_for(|s| s.resource.is_some()))
                .await
                .expect("every ClusterLoadAssignment within 30 s")
                .expect("the client");
        }
        let all_received = subscribed.elapsed();

        let (mut refresh, mut total, mut push) = (Vec::new(), Vec::new(), Vec::new());
        let mut others_pushed = 0;
        for round in 1..=rounds {
            let i = (round * 7919) % names;
            let before: Vec<Option<String>> = watchers
                .iter()
                .map(|w| w.current().resource_version)
                .collect();
            let mut want = answer(i, round as u8);
            want.sort();
            let key = name(i);
            let t0 = Instant::now();
            dns.set(&key, &want);
            tokio::time::timeout(
                BOUND,
                status.wait_for(|s| {
                    s.get(&key).is_some_and(|r| {
                        let mut got: Vec<IpAddr> = r.addresses.iter().map(|a| a.ip).collect();
                        got.sort();
                        got == want
                    })
                }),
            )
            .await
            .expect("the resolver saw the change within 30 s")
            .expect("the reloader");
            let resolved = t0.elapsed();
            let w = &mut watchers[i];
            tokio::time::timeout(BOUND, async {
                let mut state = w.current();
                while addresses(&state) != want {
                    state = w.changed().await.expect("the client");
                }
            })
            .await
            .expect("the client got the change within 30 s");
            let received = t0.elapsed();
            refresh.push(resolved);
            total.push(received);
            push.push(received.saturating_sub(resolved));
            others_pushed += watchers
                .iter()
                .zip(&before)
                .enumerate()
                .filter(|(j, (w, v))| *j != i && w.current().resource_version != **v)
                .count();
        }
        println!();
        println!(
            "tether-control DNS names: {names} services, each one name of {ADDRESSES} addresses \
             (minRefresh = maxRefresh = 1 s, TTL 1 s), one XdsClient watching every \
             ClusterLoadAssignment, {rounds} rounds, one name's answer changed a round"
        );
        println!("{:58} {:>10} {:>10}", "", "median", "max");
        let row = |what: &str, v: &mut Vec<Duration>| {
            let max = *v.iter().max().expect("rounds");
            println!(
                "{what:58} {:>8.1}ms {:>8.1}ms",
                median(v).as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3
            );
        };
        row("answer changed -> resolver status (the refresh)", &mut refresh);
        row("answer changed -> the client holds the endpoints", &mut total);
        row("the push alone (status -> client)", &mut push);
        println!(
            "ClusterLoadAssignments the client got anew besides the changed one: {others_pushed} \
             over {rounds} rounds (of {} unchanged)",
            rounds * (names - 1)
        );
        println!(
            "start: first resolution of {names} names and the first snapshot {:.0} ms; every \
             ClusterLoadAssignment at the client {:.0} ms after subscribing",
            first.as_secs_f64() * 1e3,
            all_received.as_secs_f64() * 1e3
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(others_pushed, 0, "unchanged ClusterLoadAssignments were pushed");
    });
}
