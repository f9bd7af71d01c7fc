//! The drain status of several tether-control replicas as one
//! (`tether-control drain status --admin ADDR...`).
//!
//! Replicas serving one file share no state: each knows the clients
//! connected to it and what they report, and its `GET /drain` covers those
//! only. An endpoint can be stopped when every replica says `idle` for it:
//! one `busy` replica makes it busy, and a replica that says `unknown`, does
//! not list the endpoint as DRAINING (it has not read the same file yet) or
//! does not answer makes it unknown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};

/// One replica's `GET /drain`, the fields read here.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ReplicaStatus {
    /// Its DRAINING endpoints.
    pub endpoints: Vec<ReplicaEndpoint>,
}

/// One endpoint in a replica's status.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ReplicaEndpoint {
    /// The EDS resource name.
    pub cluster: String,
    /// `IP:PORT`.
    pub address: String,
    /// `busy`, `idle` or `unknown`.
    pub verdict: String,
    /// Seconds idle, when idle.
    #[serde(default)]
    pub idle_for_s: Option<f64>,
    /// Seconds since it went DRAINING.
    #[serde(default)]
    pub draining_for_s: Option<f64>,
    /// The clients of this replica that hold its cluster.
    #[serde(default)]
    pub clients: Vec<ReplicaClient>,
    /// Removed from this replica's EDS by the service's `drain`.
    #[serde(default)]
    pub removed: bool,
}

/// One client in a replica's status.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ReplicaClient {
    /// Its node ID.
    pub node: String,
    /// `busy`, `idle`, `not reporting`, ...
    pub state: String,
    /// Requests in its latest report.
    #[serde(default)]
    pub requests: Option<u64>,
    /// Sessions it pins there, when it says.
    #[serde(default)]
    pub sessions: Option<u64>,
}

/// A replica asked: its admin address and its answer or why there is none.
#[derive(Debug, Clone)]
pub struct Replica {
    /// The admin listener asked.
    pub admin: String,
    /// Its status, or the error.
    pub answer: Result<ReplicaStatus, String>,
}

/// One endpoint across the replicas.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FleetEndpoint {
    /// The EDS resource name.
    pub cluster: String,
    /// `IP:PORT`.
    pub address: String,
    /// `busy`, `idle` or `unknown`, across every replica.
    pub verdict: &'static str,
    /// Idle on every replica: the shortest of their idle times.
    pub idle_for_s: Option<f64>,
    /// The longest time any replica has had it DRAINING.
    pub draining_for_s: Option<f64>,
    /// Whether it can be stopped: idle on every replica.
    pub can_stop: bool,
    /// Why the verdict is what it is, in a sentence.
    pub reason: String,
    /// Each replica's verdict (`missing`: it does not list the endpoint;
    /// `no answer`: the replica did not answer).
    pub replicas: Vec<ReplicaVerdict>,
    /// Every client, with the replica it is connected to.
    pub clients: Vec<FleetClient>,
}

/// A replica's verdict on one endpoint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReplicaVerdict {
    /// The replica's admin address.
    pub admin: String,
    /// Its verdict, `missing` or `no answer`.
    pub verdict: String,
    /// Whether it removed the endpoint (`drain.removeWhenIdle`/`maxDrain`).
    pub removed: bool,
}

/// A client of one replica.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FleetClient {
    /// The replica it is connected to (admin address).
    pub replica: String,
    /// What that replica says of it.
    #[serde(flatten)]
    pub client: ReplicaClient,
}

/// Every endpoint any replica lists as DRAINING, judged across all of them.
pub fn merge(replicas: &[Replica]) -> Vec<FleetEndpoint> {
    let mut keys: BTreeMap<(String, String), ()> = BTreeMap::new();
    for r in replicas {
        if let Ok(status) = &r.answer {
            for e in &status.endpoints {
                keys.insert((e.cluster.clone(), e.address.clone()), ());
            }
        }
    }
    keys.into_keys()
        .map(|(cluster, address)| judge(replicas, cluster, address))
        .collect()
}

fn judge(replicas: &[Replica], cluster: String, address: String) -> FleetEndpoint {
    let mut verdicts = Vec::new();
    let mut clients = Vec::new();
    let mut idle_for: Option<f64> = None;
    let mut draining_for: Option<f64> = None;
    let (mut busy, mut unknown, mut idle) = (Vec::new(), Vec::new(), 0);
    for r in replicas {
        let listed = match &r.answer {
            Err(e) => {
                unknown.push(format!("{} did not answer ({e})", r.admin));
                verdicts.push(ReplicaVerdict {
                    admin: r.admin.clone(),
                    verdict: "no answer".into(),
                    removed: false,
                });
                continue;
            }
            Ok(status) => status
                .endpoints
                .iter()
                .find(|e| e.cluster == cluster && e.address == address),
        };
        let Some(e) = listed else {
            unknown.push(format!("{} does not have it DRAINING", r.admin));
            verdicts.push(ReplicaVerdict {
                admin: r.admin.clone(),
                verdict: "missing".into(),
                removed: false,
            });
            continue;
        };
        verdicts.push(ReplicaVerdict {
            admin: r.admin.clone(),
            verdict: e.verdict.clone(),
            removed: e.removed,
        });
        draining_for = max(draining_for, e.draining_for_s);
        for c in &e.clients {
            clients.push(FleetClient {
                replica: r.admin.clone(),
                client: c.clone(),
            });
        }
        match e.verdict.as_str() {
            "idle" => {
                idle += 1;
                idle_for = Some(match (idle_for, e.idle_for_s) {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b).unwrap_or(0.0),
                });
            }
            "busy" => {
                let nodes: Vec<&str> = e
                    .clients
                    .iter()
                    .filter(|c| c.state == "busy")
                    .map(|c| c.node.as_str())
                    .collect();
                busy.push(if nodes.is_empty() {
                    format!("{} says busy", r.admin)
                } else {
                    format!("{} (on {})", nodes.join(", "), r.admin)
                });
            }
            other => {
                let silent: Vec<&str> = e
                    .clients
                    .iter()
                    .filter(|c| c.state != "idle" && c.state != "busy")
                    .map(|c| c.node.as_str())
                    .collect();
                unknown.push(if silent.is_empty() {
                    format!("{} says {other}", r.admin)
                } else {
                    format!("{} on {} do not report", silent.join(", "), r.admin)
                });
            }
        }
    }
    let (verdict, reason) = if !busy.is_empty() {
        ("busy", format!("still used by {}", busy.join("; ")))
    } else if !unknown.is_empty() || idle == 0 {
        ("unknown", unknown.join("; "))
    } else {
        (
            "idle",
            format!(
                "idle on every replica ({idle}) for {:.0}s: it can be stopped",
                idle_for.unwrap_or(0.0)
            ),
        )
    };
    FleetEndpoint {
        cluster,
        address,
        verdict,
        idle_for_s: (verdict == "idle").then_some(idle_for).flatten(),
        draining_for_s: draining_for,
        can_stop: verdict == "idle",
        reason,
        replicas: verdicts,
        clients,
    }
}

fn max(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The merged status as a table: a line per endpoint, its clients below,
/// then the replicas that did not answer.
pub fn render(replicas: &[Replica], endpoints: &[FleetEndpoint]) -> String {
    let secs = |s: Option<f64>| s.map_or("-".to_owned(), |s| format!("{s:.0}s"));
    let mut rows = vec![[
        "CLUSTER".to_owned(),
        "ADDRESS".to_owned(),
        "VERDICT".to_owned(),
        "IDLE FOR".to_owned(),
        "DRAINING FOR".to_owned(),
        "REPLICAS".to_owned(),
        "CLIENTS".to_owned(),
    ]];
    for e in endpoints {
        let agreeing = e.replicas.iter().filter(|r| r.verdict == "idle").count();
        let busy = e
            .clients
            .iter()
            .filter(|c| c.client.state == "busy")
            .count();
        rows.push([
            e.cluster.clone(),
            e.address.clone(),
            if e.replicas.iter().any(|r| r.removed) {
                format!("{} (removed)", e.verdict)
            } else {
                e.verdict.to_owned()
            },
            secs(e.idle_for_s),
            secs(e.draining_for_s),
            format!("{agreeing}/{} idle", e.replicas.len()),
            format!("{} ({busy} busy)", e.clients.len()),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String; 7]| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    line(&mut out, &rows[0]);
    for (row, e) in rows[1..].iter().zip(endpoints) {
        line(&mut out, row);
        for c in &e.clients {
            let figure = |name: &str, v: Option<u64>| v.map(|v| format!(", {name} {v}"));
            let _ = writeln!(
                out,
                "    {} via {}: {}{}{}",
                c.client.node,
                c.replica,
                c.client.state,
                figure("requests", c.client.requests).unwrap_or_default(),
                figure("sessions", c.client.sessions).unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "    => {}",
            if e.can_stop {
                e.reason.clone()
            } else {
                format!("{}: do not stop it yet", e.reason)
            }
        );
    }
    if endpoints.is_empty() {
        let _ = writeln!(out, "(no DRAINING endpoint on any replica)");
    }
    for r in replicas {
        if let Err(e) = &r.answer {
            let _ = writeln!(out, "replica {} did not answer: {e}", r.admin);
        }
    }
    out
}

/// `GET /drain` of the admin listener at `admin`, within `timeout`.
pub async fn fetch(admin: SocketAddr, timeout: Duration) -> Result<ReplicaStatus, String> {
    let asked = async {
        let stream = tokio::net::TcpStream::connect(admin)
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        tokio::spawn(conn);
        let request = http::Request::get("/drain")
            .header(http::header::HOST, admin.to_string())
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("GET /drain: {e}"))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("GET /drain: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("GET /drain answered {status}"));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET /drain: not a drain status: {e}"))
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs_f64())),
    }
}

/// Asks every replica at once (each within `timeout`), in the order given.
pub async fn ask(admins: &[SocketAddr], timeout: Duration) -> Vec<Replica> {
    let handles: Vec<_> = admins
        .iter()
        .map(|a| (*a, tokio::spawn(fetch(*a, timeout))))
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for (admin, handle) in handles {
        let answer = handle
            .await
            .unwrap_or_else(|e| Err(format!("the request failed: {e}")));
        out.push(Replica {
            admin: admin.to_string(),
            answer,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(admin: &str, json: serde_json::Value) -> Replica {
        Replica {
            admin: admin.into(),
            answer: Ok(serde_json::from_value(json).expect("status")),
        }
    }

    fn endpoint(verdict: &str, idle: Option<f64>, clients: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"endpoints": [{
            "cluster": "shop", "address": "10.0.0.2:80", "health": "DRAINING",
            "verdict": verdict, "idle_for_s": idle, "draining_for_s": 40.0,
            "clients": clients, "removed": false
        }]})
    }

    #[test]
    fn idle_only_when_every_replica_says_idle() {
        let idle_a = replica(
            "a",
            endpoint(
                "idle",
                Some(12.0),
                serde_json::json!([{"node": "n1", "state": "idle", "requests": 0}]),
            ),
        );
        let idle_b = replica("b", endpoint("idle", Some(7.5), serde_json::json!([])));
        let merged = merge(&[idle_a.clone(), idle_b]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].verdict, "idle");
        assert!(merged[0].can_stop);
        assert_eq!(merged[0].idle_for_s, Some(7.5));

        let busy_b = replica(
            "b",
            endpoint(
                "busy",
                None,
                serde_json::json!([{"node": "n2", "state": "busy", "requests": 9, "sessions": 2}]),
            ),
        );
        let merged = merge(&[idle_a.clone(), busy_b]);
        assert_eq!(merged[0].verdict, "busy");
        assert!(!merged[0].can_stop);
        assert!(
            merged[0].reason.contains("n2 (on b)"),
            "{}",
            merged[0].reason
        );

        let unknown_b = replica(
            "b",
            endpoint(
                "unknown",
                None,
                serde_json::json!([{"node": "envoy", "state": "not reporting"}]),
            ),
        );
        let merged = merge(&[idle_a.clone(), unknown_b]);
        assert_eq!(merged[0].verdict, "unknown");
        assert!(
            merged[0].reason.contains("envoy on b do not report"),
            "{}",
            merged[0].reason
        );
    }

    #[test]
    fn a_replica_without_the_endpoint_or_without_an_answer_makes_it_unknown() {
        let idle_a = replica("a", endpoint("idle", Some(3.0), serde_json::json!([])));
        let empty_b = replica("b", serde_json::json!({"endpoints": []}));
        let merged = merge(&[idle_a.clone(), empty_b]);
        assert_eq!(merged[0].verdict, "unknown");
        assert_eq!(merged[0].replicas[1].verdict, "missing");

        let gone = Replica {
            admin: "c".into(),
            answer: Err("cannot connect: refused".into()),
        };
        let merged = merge(&[idle_a, gone.clone()]);
        assert_eq!(merged[0].verdict, "unknown");
        assert!(merged[0].reason.contains("c did not answer"));
        let table = render(&[gone], &merged);
        assert!(
            table.contains("replica c did not answer: cannot connect: refused"),
            "{table}"
        );
    }

    #[test]
    fn the_table_names_each_client_and_the_verdict() {
        let a = replica(
            "127.0.0.1:9001",
            endpoint(
                "busy",
                None,
                serde_json::json!([{"node": "web-1", "state": "busy", "requests": 4, "sessions": 1}]),
            ),
        );
        let merged = merge(std::slice::from_ref(&a));
        let table = render(&[a], &merged);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("CLUSTER  ADDRESS"), "{table}");
        assert!(
            lines[1].starts_with("shop     10.0.0.2:80  busy"),
            "{table}"
        );
        assert_eq!(
            lines[2],
            "    web-1 via 127.0.0.1:9001: busy, requests 4, sessions 1"
        );
        assert!(lines[3].ends_with("do not stop it yet"), "{table}");
    }
}
