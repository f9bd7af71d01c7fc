//! `tether call`: grpcurl for xDS. Calls any gRPC method through tether's
//! own [`Channel`], the way the tests drive it, and prints one JSON line per
//! call saying which peer and cluster served it.
//!
//! The request is the raw bytes of `--data` and the reply is printed as
//! (lossy) UTF-8, so no `.proto` is needed: a raw-bytes codec stands where a
//! generated one would.

use std::convert::Infallible;
use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use clap::{ArgAction, Args};
use http::uri::PathAndQuery;
use serde_json::{json, Map, Value};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::Status;

use super::metrics_file::MetricsFile;
use super::xds::{emit, read_bootstrap, seconds};
use tether::channel::{Attempts, Channel, ChannelError, PickedPeer, Target};
use tether::credentials::{TlsConfig, TlsError};
use tether::session::{CookieJar, CookieJarLayer, Layer};
use tether::subchannel::KeepaliveOptions;
use tether_xds::error::code_name;

/// How long `--stats` waits for the channel's LB task to answer.
const STATS_WAIT: Duration = Duration::from_secs(5);

/// Arguments of `tether call`.
#[derive(Debug, Args)]
#[command(after_help = "\
Each call prints one JSON line on stdout, keys in this order:
  {\"call\":1,\"code\":\"OK\",\"peer\":\"127.0.0.1:41271\",\"cluster\":\"echo\",\"policy\":\"round_robin\",\
\"response\":\"...\",\"cookie\":null,\"set_cookie\":[]}
policy is the LB policy that picked the peer (xds_override_host for a session's endpoint). A failed
call has \"message\" (the status message) instead of \"response\"; peer, cluster and policy are
null when the call failed before a subchannel was picked. --stats adds {\"stats\":{...}}.
Exit status: 0 when every call was OK, 1 when one failed or the channel could not be made, 2 for
a usage error (a bad target, method or metadata).")]
pub struct CallArgs {
    /// The gRPC xDS bootstrap file for an xds:/// target. Default: the file named by
    /// GRPC_XDS_BOOTSTRAP, or the JSON in GRPC_XDS_BOOTSTRAP_CONFIG.
    #[arg(long, value_name = "FILE")]
    bootstrap: Option<PathBuf>,
    /// xds:///NAME (the listener and virtual host, from the bootstrap's control plane);
    /// static:///ADDR[,ADDR...] (round robin over those IP:PORT endpoints, cluster "static");
    /// dns:[//SERVER/]HOST[:PORT] (every address HOST resolves to, port 443 by default; a
    /// target without a scheme, such as localhost:50051, is dns:///TARGET, as in gRPC);
    /// ipv4:IP:PORT[,...], ipv6:[IP]:PORT[,...]; unix:PATH, unix:///PATH; or tonic's
    /// http://HOST[:PORT] and https://HOST[:PORT] (TLS, the system's roots unless --tls-ca).
    #[arg(value_name = "TARGET", value_parser = parse_target)]
    target: TargetArg,
    /// For a target without xDS: gRPC's default service config JSON, whose
    /// loadBalancingConfig picks the LB policy (pick_first when not given), e.g.
    /// '{"loadBalancingConfig": [{"round_robin": {}}]}'.
    #[arg(long, value_name = "JSON")]
    service_config: Option<String>,
    /// The full method name: /package.Service/Method (the leading slash may be left out).
    #[arg(value_name = "METHOD", value_parser = parse_method)]
    method: PathAndQuery,
    /// The request message: the argument's bytes as they are, UTF-8 or not (a serialized
    /// protobuf, e.g. from printf; default empty).
    #[arg(long, value_name = "TEXT", default_value = "")]
    data: OsString,
    /// Sent as the `cookie` metadata on every call (e.g. a session cookie: NAME=VALUE).
    /// With --jar the cookies start in the jar instead, so that one a response sets
    /// replaces them, as in a browser that already had them.
    #[arg(long, value_name = "VALUE", value_parser = parse_cookie)]
    cookie: Option<String>,
    /// Keep the cookies responses set (Set-Cookie) across the calls of this run and send the
    /// matching ones on later calls, as a browser would (tether's cookie jar layer).
    #[arg(long)]
    jar: bool,
    /// Metadata to send on every call; repeatable. KEY is a lowercase gRPC metadata name
    /// (letters, digits, '-', '_', '.'; not grpc-*, not *-bin).
    #[arg(long = "metadata", value_name = "KEY:VALUE", value_parser = parse_metadata)]
    metadata: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    /// How many calls to make, one after the other.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    count: u64,
    /// Each call's deadline, in seconds (`2`, `0.5`, `1.5s`). Default: none.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    timeout: Option<Duration>,
    /// HTTP/2 keepalive (gRFC A8): a PING every SECS while calls are open; a connection that
    /// does not answer within --keepalive-timeout is closed and its calls fail UNAVAILABLE, so
    /// a backend that stops answering without closing is left within time + timeout.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    keepalive_time: Option<Duration>,
    /// How long a keepalive PING may go unanswered (default 20 s, as in gRPC); needs
    /// --keepalive-time.
    #[arg(long, value_name = "SECS", value_parser = seconds, requires = "keepalive_time")]
    keepalive_timeout: Option<Duration>,
    /// TLS on every connection to the endpoints, verified against the CA certificates in
    /// FILE (PEM). Servers must carry the target's name (xds:///NAME) or, for a static
    /// target, the endpoint's IP address, unless --tls-server-name says otherwise.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// With --tls-ca: the client certificate chain (PEM, leaf first) presented to servers
    /// that ask (mTLS); needs --tls-key.
    #[arg(long, value_name = "FILE", requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// With --tls-cert: its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// With --tls-ca: the name servers' certificates must carry (a DNS name or an IP).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// Wait for a usable endpoint instead of failing while there is none (gRPC's
    /// wait_for_ready); use with --timeout.
    #[arg(long)]
    wait_for_ready: bool,
    /// After the calls, print the channel's LB tree with its states and call counts as one more
    /// JSON line {"stats": ...}.
    #[arg(long)]
    stats: bool,
    /// Keep the channel (its xDS stream and its load reports, gRFC A27) open this many seconds
    /// after the last call, so that what a short-lived client reports can be watched.
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    linger: Option<Duration>,
    /// Write gRPC's metrics the channel recorded (gRFC A66: attempts, attempt and call
    /// durations, message bytes, by method, target and status) to FILE at exit, as OTLP JSON:
    /// one ExportMetricsServiceRequest per line, as OpenTelemetry's file exporter writes them.
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Log the channel's, subchannels' and XdsClient's lines to stderr: -v info, -vv debug,
    /// -vvv trace (one line per call). Default: warnings. RUST_LOG, when set, overrides.
    #[arg(short, long, action = ArgAction::Count)]
    verbose: u8,
}

/// A target as written and as parsed.
#[derive(Debug, Clone)]
struct TargetArg {
    text: String,
    parsed: Target,
}

fn parse_target(text: &str) -> Result<TargetArg, String> {
    let parsed = Target::parse(text).map_err(|e| match e {
        ChannelError::Target { problem, .. } => problem.to_string(),
        other => other.to_string(),
    })?;
    Ok(TargetArg {
        text: text.to_owned(),
        parsed,
    })
}

fn parse_method(text: &str) -> Result<PathAndQuery, String> {
    let path = if text.starts_with('/') {
        text.to_owned()
    } else {
        format!("/{text}")
    };
    let valid = path[1..].split_once('/').is_some_and(|(service, method)| {
        !service.is_empty() && !method.is_empty() && !method.contains('/')
    });
    if !valid {
        return Err("is not a method name (expected /package.Service/Method)".into());
    }
    match path.parse::<PathAndQuery>() {
        Ok(p) if p.query().is_none() => Ok(p),
        _ => Err("is not a valid HTTP/2 path (expected /package.Service/Method)".into()),
    }
}

const VALUE_RULE: &str = "printable ASCII only";

/// A gRPC ASCII metadata value: printable ASCII (http's header values also
/// take bytes above 0x7f, which gRPC does not).
fn ascii_value(text: &str) -> Option<AsciiMetadataValue> {
    if !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return None;
    }
    AsciiMetadataValue::try_from(text).ok()
}

fn parse_cookie(text: &str) -> Result<String, String> {
    match ascii_value(text) {
        Some(_) => Ok(text.to_owned()),
        None => Err(format!("is not a valid metadata value ({VALUE_RULE})")),
    }
}

fn parse_metadata(text: &str) -> Result<(AsciiMetadataKey, AsciiMetadataValue), String> {
    let Some((key, value)) = text.split_once(':') else {
        return Err("has no ':' (expected KEY:VALUE)".into());
    };
    let valid_key = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if !valid_key {
        return Err(format!(
            "the key {key:?} is not a lowercase gRPC metadata name (letters, digits, '-', '_', '.')"
        ));
    }
    if key.starts_with("grpc-") {
        return Err(format!("the key {key:?} is reserved by gRPC (grpc-*)"));
    }
    if key.ends_with("-bin") {
        return Err(format!(
            "the key {key:?} is binary metadata (*-bin), which --metadata does not send"
        ));
    }
    let key = AsciiMetadataKey::from_bytes(key.as_bytes())
        .map_err(|_| format!("the key {key:?} is not a valid metadata name"))?;
    let value = value.trim();
    let value = ascii_value(value).ok_or_else(|| {
        format!("the value {value:?} is not a valid metadata value ({VALUE_RULE})")
    })?;
    Ok((key, value))
}

/// The TLS configuration of `--tls-ca` and the flags that go with it.
fn tls_config(ca: &std::path::Path, a: &CallArgs) -> Result<TlsConfig, TlsError> {
    let mut tls = TlsConfig::from_ca_file(ca)?;
    if let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) {
        tls = tls.with_identity_files(cert, key)?;
    }
    if let Some(name) = &a.tls_server_name {
        tls = tls.with_server_name(name)?;
    }
    Ok(tls)
}

/// Runs `tether call`: prints one line per call and returns the exit code.
pub fn run(a: CallArgs) -> i32 {
    super::init_logging(match a.verbose {
        0 => log::LevelFilter::Warn,
        1 => log::LevelFilter::Info,
        2 => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    });
    let mut builder = Channel::builder().wait_for_ready(a.wait_for_ready);
    if let Some(time) = a.keepalive_time {
        let mut keepalive = KeepaliveOptions::new(time);
        if let Some(timeout) = a.keepalive_timeout {
            keepalive = keepalive.with_timeout(timeout);
        }
        builder = builder.keepalive(keepalive);
    }
    if let Some(ca) = &a.tls_ca {
        match tls_config(ca, &a) {
            Ok(tls) => builder = builder.tls(tls),
            Err(e) => {
                eprintln!("tether: {e}");
                return 1;
            }
        }
    }
    let builder = match &a.target.parsed {
        Target::Xds { .. } => {
            if a.service_config.is_some() {
                eprintln!(
                    "tether: --service-config: an xds:/// target takes its LB policy from xDS \
                     (target {:?})",
                    a.target.text
                );
                return 2;
            }
            match read_bootstrap(a.bootstrap.as_deref()) {
                Ok(b) => builder.bootstrap(b),
                Err(e) => {
                    eprintln!("tether: {e}");
                    return 1;
                }
            }
        }
        _ => {
            if let Some(path) = &a.bootstrap {
                log::warn!(
                    "--bootstrap {}: not used by the target {:?} (only by xds:///)",
                    path.display(),
                    a.target.text
                );
            }
            match &a.service_config {
                Some(json) => builder.default_service_config(json.clone()),
                None => builder,
            }
        }
    };
    let metrics = match a.metrics.as_deref().map(MetricsFile::create) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => {
            eprintln!("tether: {e}");
            return 1;
        }
    };
    let builder = match &metrics {
        Some(m) => builder.telemetry(m.telemetry()),
        None => builder,
    };
    let Some(runtime) = super::runtime() else {
        return 1;
    };
    let code = runtime.block_on(async move {
        // The channel spawns its tasks: it must be made inside the runtime.
        match builder.connect(&a.target.text) {
            Ok(channel) => calls(&a, channel).await,
            // Usage errors: what was given cannot work.
            Err(e @ (ChannelError::Target { .. } | ChannelError::ServiceConfig { .. })) => {
                eprintln!("tether: {e}");
                2
            }
            Err(e) => {
                eprintln!("tether: {e}");
                1
            }
        }
    });
    match metrics.map(MetricsFile::write) {
        Some(Err(e)) => {
            eprintln!("tether: {e}");
            code.max(1)
        }
        _ => code,
    }
}

async fn calls(a: &CallArgs, channel: Channel) -> i32 {
    let record = Arc::new(Mutex::new(Record::default()));
    let recorder = Recorder {
        channel: channel.clone(),
        record: record.clone(),
    };
    if a.jar {
        let jar = CookieJar::new();
        for pair in a.cookie.iter().flat_map(|c| c.split(';')) {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            if let Err(e) = jar.insert_raw(&format!("{pair}; Path=/"), "/") {
                eprintln!("tether: --cookie {pair:?}: {e}");
                return 2;
            }
        }
        let service = CookieJarLayer::new(jar).layer(recorder);
        run_calls(a, &channel, &record, service).await
    } else {
        run_calls(a, &channel, &record, recorder).await
    }
}

/// The calls through `service` (the channel, recorded, maybe behind the
/// cookie jar), one JSON line each.
async fn run_calls<S>(
    a: &CallArgs,
    channel: &Channel,
    record: &Arc<Mutex<Record>>,
    service: S,
) -> i32
where
    S: tower_service::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send,
{
    let mut grpc = tonic::client::Grpc::new(service);
    let data = Bytes::copy_from_slice(a.data.as_encoded_bytes());
    let mut all_ok = true;
    for n in 1..=a.count {
        *lock(record) = Record::default();
        let mut request = tonic::Request::new(data.clone());
        let metadata = request.metadata_mut();
        if let Some(cookie) = a.cookie.as_ref().filter(|_| !a.jar) {
            if let Some(v) = ascii_value(cookie) {
                metadata.append("cookie", v);
            }
        }
        for (k, v) in &a.metadata {
            metadata.append(k.clone(), v.clone());
        }
        if let Some(t) = a.timeout {
            request.set_timeout(t);
        }
        if let Err(e) = grpc.ready().await {
            match e {}
        }
        let call = grpc.unary(request, a.method.clone(), RawCodec);
        let result = call.await;
        let mut line = Map::new();
        line.insert("call".into(), json!(n));
        let (peer, metadata) = match &result {
            Ok(response) => {
                line.insert("code".into(), json!("OK"));
                (
                    response.extensions().get::<PickedPeer>().cloned(),
                    response.metadata(),
                )
            }
            Err(status) => {
                all_ok = false;
                line.insert("code".into(), json!(code_name(status.code())));
                // tonic drops a failed call's response extensions: the
                // recorder kept its pick.
                (lock(record).peer.clone(), status.metadata())
            }
        };
        line.insert(
            "peer".into(),
            peer.as_ref()
                .map_or(Value::Null, |p| json!(p.0.to_string())),
        );
        line.insert(
            "cluster".into(),
            peer.as_ref().map_or(Value::Null, |p| json!(&*p.1)),
        );
        line.insert(
            "policy".into(),
            peer.as_ref().map_or(Value::Null, |p| json!(p.2)),
        );
        // gRPC's attempts (A6 retries from the route's policy).
        line.insert("attempts".into(), json!(lock(record).attempts));
        match &result {
            Ok(response) => line.insert(
                "response".into(),
                json!(String::from_utf8_lossy(response.get_ref())),
            ),
            Err(status) => line.insert("message".into(), json!(status.message())),
        };
        // What went out: --cookie, merged with the jar's by the layer.
        line.insert("cookie".into(), json!(lock(record).cookie));
        line.insert("set_cookie".into(), json!(set_cookies(metadata)));
        if let Err(code) = emit(&Value::Object(line).to_string()) {
            return code;
        }
    }
    if a.stats {
        let stats = tokio::time::timeout(STATS_WAIT, channel.stats())
            .await
            .ok()
            .flatten();
        if let Err(code) = emit(&json!({ "stats": stats }).to_string()) {
            return code;
        }
    }
    if let Some(linger) = a.linger {
        // The channel lives (and reports) until this returns.
        tokio::time::sleep(linger).await;
    }
    i32::from(!all_ok)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every `set-cookie` in the response's initial metadata.
fn set_cookies(metadata: &MetadataMap) -> Vec<String> {
    metadata
        .get_all("set-cookie")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect()
}

/// What the recorder saw of the call in flight.
#[derive(Debug, Default)]
struct Record {
    /// The `cookie` header as it went to the channel.
    cookie: Option<String>,
    /// The pick: tonic turns a failed call's response into a `Status` and
    /// drops its extensions, where the channel put the [`PickedPeer`].
    peer: Option<PickedPeer>,
    /// The attempts the channel made (its [`Attempts`]).
    attempts: Option<u32>,
}

/// The channel, recording the call in flight (it sits inside the cookie jar
/// layer, so it sees the cookie header the jar completed).
#[derive(Clone)]
struct Recorder {
    channel: Channel,
    record: Arc<Mutex<Record>>,
}

type Body = tonic::body::Body;

impl tower_service::Service<http::Request<Body>> for Recorder {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let record = self.record.clone();
        lock(&record).cookie = request
            .headers()
            .get(http::header::COOKIE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let response = self.channel.call(request);
        Box::pin(async move {
            let response = response.await?;
            let mut r = lock(&record);
            r.peer = response.extensions().get::<PickedPeer>().cloned();
            r.attempts = response.extensions().get::<Attempts>().map(|a| a.0);
            drop(r);
            Ok(response)
        })
    }
}

/// A codec for messages as raw bytes: what `--data` holds goes out as it is,
/// and the reply comes back whole.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_get_their_leading_slash() {
        assert_eq!(parse_method("/a.B/C").unwrap(), "/a.B/C");
        assert_eq!(parse_method("a.B/C").unwrap(), "/a.B/C");
        for bad in ["a.B", "/a.B/", "//C", "/a/B/C", "/a.B/C?x=1", "/a B/C"] {
            assert!(parse_method(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn metadata_keys_are_lowercase_names() {
        let (k, v) = parse_metadata("x-user: alice").unwrap();
        assert_eq!((k.as_str(), v.to_str().unwrap()), ("x-user", "alice"));
        for (bad, problem) in [
            ("X-User:a", "\"X-User\""),
            ("novalue", "no ':'"),
            (":a", "\"\""),
            ("grpc-timeout:1S", "reserved"),
            ("x-bin:AAAA", "binary"),
            ("x:caf\u{e9}", "\"caf\u{e9}\""),
        ] {
            let e = parse_metadata(bad).unwrap_err();
            assert!(e.contains(problem), "{bad}: {e}");
        }
    }
}
