//! `tether cookie decode` and `tether cookie encode`.

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;
use tether_core::cookie::readers::{self, Reader, Reading};
use tether_core::cookie::{self, sealed, Format, KeyRing, SessionCookie, Signature};
use tether_core::http::set_cookie::{CookieSpec, Style};
use tether_core::AddressList;

/// Cookie subcommands.
#[derive(Debug, Subcommand)]
pub enum CookieCommand {
    /// Decode a session cookie value in any format (quoted or not) and print it as JSON.
    Decode(DecodeArgs),
    /// Encode a session cookie in a format and print the value (and a Set-Cookie with --name).
    Encode(EncodeArgs),
}

/// Arguments of `tether cookie decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The cookie value, e.g. Cg8xMjcuMC4wLjE6MTkwMDE= or "Cg8x...=" or MTI3LjAuMC4xOjQ0Mzs=
    value: String,
    /// A file of base64 secrets, one a line, to verify a MAC or open a
    /// sealed value with (every one is tried: a key ring). Never a secret on
    /// the command line, where `ps` and shell history show it.
    #[arg(long = "key-file", value_name = "FILE")]
    key_file: Option<std::path::PathBuf>,
    /// Judge expiry at this epoch second instead of now.
    #[arg(long, value_name = "EPOCH_SECONDS")]
    now: Option<u64>,
    /// The value is a session header's (Envoy's header session state), not a cookie's.
    #[arg(long)]
    header: bool,
}

/// Arguments of `tether cookie encode`.
#[derive(Debug, Args)]
pub struct EncodeArgs {
    /// An upstream address ip:port ([v6]:port); repeat for the endpoint's other addresses.
    #[arg(long = "address", value_name = "ADDR", required = true)]
    addresses: Vec<String>,
    /// The cluster that serves the session (formats envoy and grpc).
    #[arg(long)]
    cluster: Option<String>,
    /// Time to live: seconds ("120") or a protobuf duration ("120s", "1.5s").
    /// Sets the expiry inside an envoy cookie and Max-Age in the Set-Cookie.
    #[arg(long)]
    ttl: Option<String>,
    /// Wire format to write (`sealed` needs --key-file).
    #[arg(long, default_value = "envoy", value_parser = ["envoy", "grpc", "legacy", "sealed"])]
    format: String,
    /// A file of base64 secrets, one a line: the first signs (format envoy,
    /// at least 16 bytes each) or seals (format sealed, at least 32 bytes
    /// each, with a random nonce).
    #[arg(long = "key-file", value_name = "FILE")]
    key_file: Option<std::path::PathBuf>,
    /// Also render a Set-Cookie for a cookie with this name.
    #[arg(long)]
    name: Option<String>,
    /// Path attribute of the rendered Set-Cookie.
    #[arg(long, default_value = "", requires = "name")]
    path: String,
    /// Compute the expiry from this epoch second instead of now.
    #[arg(long, value_name = "EPOCH_SECONDS")]
    now: Option<u64>,
    /// Write a session header's value (Envoy's header session state reads
    /// `legacy` as plain `ip:port`), not a cookie's.
    #[arg(long, conflicts_with = "name")]
    header: bool,
}

/// Runs a cookie subcommand and returns its JSON output.
pub fn run(cmd: CookieCommand) -> Result<Value, String> {
    match cmd {
        CookieCommand::Decode(a) => decode(a),
        CookieCommand::Encode(a) => encode(a),
    }
}

/// The key ring in `file`: one base64 secret a line (blank lines and
/// `#` comments skipped), the first signing. Errors name the file and the
/// line, never the secret.
fn keys(file: Option<&std::path::Path>) -> Result<KeyRing, String> {
    let Some(file) = file else {
        return Ok(KeyRing::empty());
    };
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("--key-file {}: {e}", file.display()))?;
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    if lines.is_empty() {
        return Err(format!("--key-file {}: holds no key", file.display()));
    }
    for (n, line) in &lines {
        // Each alone first, so that an error names its line.
        KeyRing::from_base64([*line]).map_err(|e| {
            let why = e.to_string();
            let why = why
                .split_once(": ")
                .map_or(why.as_str(), |(_, w)| w)
                .to_owned();
            format!("--key-file {} line {n}: {why}", file.display())
        })?;
    }
    KeyRing::from_base64(lines.iter().map(|(_, l)| *l))
        .map_err(|e| format!("--key-file {}: {e}", file.display()))
}

fn decode(a: DecodeArgs) -> Result<Value, String> {
    let ring = keys(a.key_file.as_deref())?;
    let d = cookie::decode(&a.value, &ring).map_err(|e| match sealed::key_id(&a.value) {
        Some(id) if e == cookie::DecodeError::Sealed => format!(
            "cookie {:?}: {e}; it names key id {}{}",
            a.value,
            hex(&id),
            if ring.is_empty() {
                " (give its key with --key-file)"
            } else {
                ""
            }
        ),
        _ => format!("cookie {:?}: {e}", a.value),
    })?;
    let now = a.now.unwrap_or_else(super::now);
    let (signature, key) = match d.signature {
        Signature::Unsigned => ("unsigned", None),
        Signature::Valid { key } => ("valid", Some(key)),
        Signature::Invalid => ("invalid", None),
        Signature::Unchecked => ("unchecked", None),
    };
    let mut readers = readers_json(&a.value, now);
    if d.format == Format::Sealed {
        // Only a holder of the keys reads it: tether, as here.
        readers["tether"] = json!({ "pins": d.cookie.addresses.as_slice().iter().map(ToString::to_string).collect::<Vec<_>>() });
    }
    Ok(json!({
        "format": d.format.as_str(),
        "key_id": sealed::key_id(&a.value).map(|id| hex(&id)),
        "addresses": d.cookie.addresses.as_slice().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "cluster": d.cookie.cluster,
        "expires": d.cookie.expires,
        "expired": d.cookie.is_expired(now),
        "signature": signature,
        "key": key,
        "quoted": d.quoted,
        "padded": d.padded,
        "readers": readers,
    }))
    .inspect(|_| {
        if d.format != Format::Sealed {
            warn_unread(&a.value, d.format, d.cookie.addresses.primary(), a.header, now);
        }
    })
    .inspect(|_| {
        if d.cookie.expires.is_some_and(|e| e < cookie::WALL_CLOCK_FLOOR) {
            log::warn!(
                "expires {} counts seconds since an Envoy host booted (Envoy 1.36 to 1.38 wrote \
                 it so): no other process can judge it, tether keeps the session, Envoy 1.39 and \
                 later treat it as expired",
                d.cookie.expires.unwrap_or_default()
            );
        }
    })
}

/// What each reader makes of `value` at `now`.
fn readers_json(value: &str, now: u64) -> Value {
    let mut m = serde_json::Map::new();
    for r in Reader::ALL {
        let v = match readers::read(r, value, now) {
            Reading::Pins(list) => json!({ "pins": list }),
            Reading::NoSession(miss) => json!({ "miss": miss.code(), "why": miss.to_string() }),
        };
        m.insert(r.as_str().to_owned(), v);
    }
    Value::Object(m)
}

/// Warns on stderr, naming the reader, when a reader that takes `format`
/// will not pin `primary` from `value`.
fn warn_unread(value: &str, format: Format, primary: SocketAddr, header: bool, now: u64) {
    for r in readers::promised(format, header) {
        if !readers::honours(*r, value, primary, now) {
            let why = match readers::read(*r, value, now) {
                Reading::NoSession(miss) => miss.to_string(),
                Reading::Pins(list) => format!("it looks up {list:?}"),
            };
            log::warn!(
                "{} will not pin {primary} from this {format} value: {why}",
                r.describe()
            );
        }
    }
}

/// Lowercase hex, as a key id is shown.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    tether_core::duration::parse(text).map_err(|e| format!("--ttl: {text:?} {e}"))
}

fn encode(a: EncodeArgs) -> Result<Value, String> {
    let mut list: Vec<SocketAddr> = Vec::with_capacity(a.addresses.len());
    for (i, text) in a.addresses.iter().enumerate() {
        list.push(tether_core::address::parse(text).map_err(|e| format!("--address[{i}]: {e}"))?);
    }
    let addresses = AddressList::new(list).ok_or("--address: at least one is needed")?;
    let format: Format = a.format.parse().map_err(|e| format!("--format: {e}"))?;
    let ttl = a
        .ttl
        .as_deref()
        .map(parse_ttl)
        .transpose()?
        .unwrap_or(Duration::ZERO);
    let now = a.now.unwrap_or_else(super::now);
    let ring = keys(a.key_file.as_deref())?;
    let mut c = SessionCookie::new(addresses);
    c.cluster = a.cluster.clone();
    c.expires = format.expiry_after(ttl, now);
    let value = if format == Format::Sealed {
        let key = ring
            .signer()
            .ok_or("--format sealed needs --key-file (base64 secrets of at least 32 bytes)")?;
        let file = a.key_file.as_deref().unwrap_or(std::path::Path::new(""));
        ring.check_sealing()
            .map_err(|e| format!("--key-file {}: {e}", file.display()))?;
        let mut nonce = [0; sealed::NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|e| format!("no random nonce: {e}"))?;
        sealed::seal(&c, key, &nonce)
    } else if a.header {
        cookie::encode_header(&c, format, ring.signer())
    } else {
        cookie::encode(&c, format, ring.signer())
    }
    .map_err(|e| e.to_string())?;
    let primary = c.addresses.primary();
    if format == Format::Legacy && !a.header && !readers::legacy_text_read_by_envoy(primary) {
        log::info!(
            "{primary}: its plain text is a protobuf to stock Envoy's cookie session state, which \
             would then see no session; written guarded (text, \";<\", Envoy's field 1), which \
             Envoy, gRPC C-core and tether read"
        );
    }
    if c.expires.is_some() && format == Format::Envoy {
        log::warn!(
            "Envoy 1.36 to 1.38 judge expires against seconds since their host booted: this \
             cookie never expires there (its Max-Age still bounds the client's copy); Envoy 1.39 \
             and later, gRPC C-core and tether judge it as written"
        );
    }
    if format != Format::Sealed {
        warn_unread(&value, format, primary, a.header, now);
    }
    let set_cookie = match &a.name {
        None => None,
        Some(name) => {
            let spec = CookieSpec::new(name, &a.path, ttl, Vec::new()).map_err(|e| {
                let e = e.to_string();
                format!("--{e}")
            })?;
            Some(
                spec.render(&value, Style::for_format(format))
                    .map_err(|e| e.to_string())?,
            )
        }
    };
    Ok(json!({
        "value": value,
        "format": format.as_str(),
        "expires": c.expires,
        "signed": ring.signer().is_some() && format == Format::Envoy,
        "key_id": sealed::key_id(&value).map(|id| hex(&id)),
        "set_cookie": set_cookie,
    }))
}
