//! An in-process DNS server on 127.0.0.1: UDP and TCP on one free port,
//! answering A and AAAA queries from records the test changes while it
//! runs (hickory's server with a handler of its own, no zone files).
//!
//! A name with addresses answers them (with the TTL set by
//! [`DnsServer::set_ttl`]); a name set with no address answers NOERROR
//! with no records; an unknown name answers NXDOMAIN. [`DnsServer::fail`]
//! makes every answer an error code (SERVFAIL, REFUSED), and
//! [`DnsServer::stop`] closes the sockets (a server that is gone) until
//! [`DnsServer::resume`] opens them again on the same port. Every query
//! answered is counted ([`DnsServer::queries`]), so a test can wait for
//! the next resolution instead of sleeping.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Header, HeaderCounts, Metadata};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;
use tokio::sync::watch;

/// The response codes [`DnsServer::fail`] takes.
pub use hickory_proto::op::ResponseCode;

/// What the server answers.
#[derive(Debug, Default)]
struct Zone {
    /// Name (lower case, no trailing dot) → its addresses.
    names: BTreeMap<String, Vec<IpAddr>>,
    ttl: u32,
    /// Answer every query with this code instead.
    failing: Option<ResponseCode>,
}

#[derive(Debug, Clone)]
struct Handler {
    zone: Arc<Mutex<Zone>>,
    queries: Arc<watch::Sender<u64>>,
}

/// A running DNS server; stopped when dropped.
pub struct DnsServer {
    addr: SocketAddr,
    handler: Handler,
    server: Option<Server<Handler>>,
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer")
            .field("addr", &self.addr)
            .field("running", &self.server.is_some())
            .finish()
    }
}

impl DnsServer {
    /// Starts a server with no names on a free port of 127.0.0.1 (UDP and
    /// TCP), records with a TTL of 0.
    pub async fn start() -> DnsServer {
        let handler = Handler {
            zone: Arc::new(Mutex::new(Zone::default())),
            queries: Arc::new(watch::channel(0).0),
        };
        for _ in 0..100 {
            // A port outside the ephemeral range: while the server is
            // stopped, the kernel could otherwise hand its port to a
            // resolver's query socket, and `resume` could not bind it.
            let addr = SocketAddr::from(([127, 0, 0, 1], crate::free_port()));
            let Ok(udp) = tokio::net::UdpSocket::bind(addr).await else {
                continue;
            };
            // The same port for TCP, if free.
            let Ok(tcp) = tokio::net::TcpListener::bind(addr).await else {
                continue;
            };
            let mut server = Server::new(handler.clone());
            server.register_socket(udp);
            server.register_listener(tcp, Duration::from_secs(10), 64);
            return DnsServer {
                addr,
                handler,
                server: Some(server),
            };
        }
        panic!("no 127.0.0.1 port free for both UDP and TCP in 100 tries");
    }

    /// Where it listens (UDP and TCP), for a resolver's server list.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Makes `name` answer `ips` (A for IPv4, AAAA for IPv6); an empty
    /// list makes it a name with no address records (NOERROR, no answer).
    pub fn set(&self, name: &str, ips: &[IpAddr]) {
        self.zone().names.insert(key(name), ips.to_vec());
    }

    /// Removes `name`: it answers NXDOMAIN.
    pub fn remove(&self, name: &str) {
        self.zone().names.remove(&key(name));
    }

    /// The TTL of the records from now on, in seconds.
    pub fn set_ttl(&self, ttl: u32) {
        self.zone().ttl = ttl;
    }

    /// Answers every query with `code` (e.g. SERVFAIL), or normally again
    /// with `None`.
    pub fn fail(&self, code: Option<ResponseCode>) {
        self.zone().failing = code;
    }

    /// The number of queries answered so far, changing with each.
    pub fn queries(&self) -> watch::Receiver<u64> {
        self.handler.queries.subscribe()
    }

    /// Waits until `more` queries beyond those answered so far are
    /// answered, or `timeout` passes; whether they were.
    pub async fn wait_queries(&self, more: u64, timeout: Duration) -> bool {
        let mut rx = self.queries();
        let target = *rx.borrow_and_update() + more;
        tokio::time::timeout(timeout, rx.wait_for(|n| *n >= target))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Closes the sockets: queries go unanswered (UDP) or are refused (TCP)
    /// until [`DnsServer::resume`].
    pub async fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.shutdown_gracefully().await;
        }
    }

    /// Opens the sockets again on the same port.
    pub async fn resume(&mut self) -> std::io::Result<()> {
        if self.server.is_some() {
            return Ok(());
        }
        let udp = tokio::net::UdpSocket::bind(self.addr).await?;
        let tcp = tokio::net::TcpListener::bind(self.addr).await?;
        let mut server = Server::new(self.handler.clone());
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(10), 64);
        self.server = Some(server);
        Ok(())
    }

    fn zone(&self) -> std::sync::MutexGuard<'_, Zone> {
        self.handler
            .zone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A name as the zone keys it: lower case, without the trailing dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Handler {
    /// The response code and records for a query.
    fn answer(&self, name: &Name, qtype: RecordType) -> (ResponseCode, Vec<Record>) {
        let zone = self
            .zone
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(code) = zone.failing {
            return (code, Vec::new());
        }
        let Some(ips) = zone.names.get(&key(&name.to_string())) else {
            return (ResponseCode::NXDomain, Vec::new());
        };
        let records = ips
            .iter()
            .filter_map(|ip| match (ip, qtype) {
                (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(*v4))),
                (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
                _ => None,
            })
            .map(|data| Record::from_rdata(name.clone(), zone.ttl, data))
            .collect();
        (ResponseCode::NoError, records)
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = true;
        let (code, records) = match request.request_info() {
            Ok(info) => self.answer(&Name::from(info.query.name()), info.query.query_type()),
            Err(_) => (ResponseCode::FormErr, Vec::new()),
        };
        metadata.response_code = code;
        let response = MessageResponseBuilder::from_message_request(request).build(
            metadata,
            records.iter(),
            [],
            [],
            [],
        );
        let sent = response_handle.send_response(response).await;
        self.queries.send_modify(|n| *n += 1);
        sent.unwrap_or_else(|_| {
            let mut failed = Metadata::response_from_request(&request.metadata);
            failed.response_code = ResponseCode::ServFail;
            ResponseInfo::from(Header {
                metadata: failed,
                counts: HeaderCounts::default(),
            })
        })
    }
}
