//! Envoy's route `hash_policy`, evaluated against a plain view of a request.
//!
//! Policies are evaluated in order. Each one that finds its input yields
//! XXH64 (seed 0) of it, folded into the running hash with
//! [`combine`] (`rotl64(hash, 1) ^ new`). After a policy marked
//! `terminal`, evaluation stops if a hash exists by then (from it or an
//! earlier policy). No hash at all is [`RequestHash::NoHash`]: the caller picks
//! at random, as Envoy's ring hash and Maglev balancers do.
//!
//! | source | input hashed (Envoy 1.40) |
//! |---|---|
//! | header | the header's value; repeated headers: see below; optional regex rewrite (feature `regex`) |
//! | cookie | the first cookie of that name across `Cookie` headers, surrounding quotes removed; an empty value counts as absent |
//! | source IP | the downstream address without port (`10.0.0.1`, `::1`) |
//! | query parameter | the first value of that parameter in `:path`, not percent-decoded |
//! | filter state | the object's own hash; tether takes the string of an `envoy.hashable_string` and hashes it |
//!
//! **Repeated headers.** Envoy hashes every value of the header: the values
//! (after any rewrite) are sorted bytewise and chained, `h = XXH64(v1, 0)`,
//! `h = XXH64(v2, h)`, ..., so `a` then `b` hashes like `b` then `a`; a single
//! value is plain XXH64. gRPC C-core instead joins the values with `,` and
//! hashes the result. [`Peer`] selects which; both are offered.
//!
//! **Cookies** are found with [`cookie_header::find`], which reads pairs split
//! on `;` (and on `,`, for folded headers) with spaces trimmed; Envoy splits
//! on `;` only and keeps trailing spaces. Well-formed headers give the same
//! value either way.
//!
//! **Filter state** in gRPC C-core exists only for `io.grpc.channel_id`;
//! callers put whatever string stands for it in [`HashRequest::filter_state`].
//!
//! **Generated cookie.** A cookie policy with a `ttl` (even `0s`) makes Envoy
//! generate the cookie when the request has none: its value is the 16
//! lowercase hex digits of XXH64(`remote_address + local_address`) (both
//! `ip:port`, IPv6 in brackets), that value is hashed, and the response
//! carries `Set-Cookie: name="<value>"[; Max-Age=ttl][; Path=path][; attrs];
//! HttpOnly`, rendered by [`CookieSpec::render`] in [`Style::Envoy`]. Without
//! both addresses no cookie is generated and the policy yields nothing,
//! unless the caller gives the value ([`HashRequest::generated`]).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::{self, Write as _};
use core::net::SocketAddr;
use core::time::Duration;
use serde_json::{Map, Value};

use super::{combine, xxh64, RequestHash};
use crate::config::{self, ConfigError, Problem};
use crate::http::cookie_header;
use crate::http::set_cookie::{CookieSpec, Style};
use crate::http::syntax::is_token;

#[cfg(feature = "regex")]
use super::rewrite::Rewrite;

/// Whose rules to follow where Envoy and gRPC C-core differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Peer {
    /// Envoy: repeated header values sorted and chained; every source honoured.
    #[default]
    Envoy,
    /// gRPC C-core (gRFC A42): repeated header values joined with `,`;
    /// headers ending in `-bin` skipped; cookie, source IP and query
    /// parameter policies yield nothing (C-core ignores them).
    Grpc,
    /// A gRPC client that goes beyond C-core (tether's channel): headers
    /// as [`Peer::Grpc`], cookie (generated ones included) and query
    /// parameter policies as [`Peer::Envoy`]; source IP yields nothing (a
    /// client has no downstream peer).
    GrpcExtended,
}

/// Where a policy takes its input from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A request header.
    Header(HeaderSource),
    /// A cookie; with `generate`, one is minted when absent.
    Cookie {
        /// Cookie name.
        name: String,
        /// The `Set-Cookie` to send when the request has no such cookie
        /// (present when the policy has a `ttl`, even `0s`).
        generate: Option<CookieSpec>,
    },
    /// The downstream IP address, without port.
    SourceIp,
    /// A query parameter of `:path`.
    QueryParameter {
        /// Parameter name (exact, not decoded).
        name: String,
    },
    /// A filter-state object, by key.
    FilterState {
        /// Filter-state key.
        key: String,
    },
}

/// A header source: the name (stored lowercase) and an optional rewrite.
#[derive(Debug, Clone)]
pub struct HeaderSource {
    name: String,
    #[cfg(feature = "regex")]
    rewrite: Option<Rewrite>,
}

impl HeaderSource {
    /// The header name, lowercase.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The regex rewrite applied to each value before hashing.
    #[cfg(feature = "regex")]
    pub fn rewrite(&self) -> Option<&Rewrite> {
        self.rewrite.as_ref()
    }
}

/// One hash policy: a source and whether it is terminal.
#[derive(Debug, Clone)]
pub struct HashPolicy {
    source: Source,
    terminal: bool,
}

impl HashPolicy {
    /// Hash the value(s) of header `name` (case-insensitive).
    pub fn header(name: &str) -> Result<Self, PolicyError> {
        if name.is_empty() {
            return Err(cfg_err("header.header_name", name, Problem::Missing));
        }
        // Pseudo-headers such as `:authority` are valid names too.
        let bare = name.strip_prefix(':').unwrap_or(name);
        if !is_token(bare) {
            return Err(cfg_err("header.header_name", name, Problem::NotToken));
        }
        Ok(HashPolicy::new(Source::Header(HeaderSource {
            name: name.to_ascii_lowercase(),
            #[cfg(feature = "regex")]
            rewrite: None,
        })))
    }

    /// Hash header `name` after rewriting each value with `rewrite`.
    #[cfg(feature = "regex")]
    pub fn header_rewritten(name: &str, rewrite: Rewrite) -> Result<Self, PolicyError> {
        let mut p = HashPolicy::header(name)?;
        if let Source::Header(h) = &mut p.source {
            h.rewrite = Some(rewrite);
        }
        Ok(p)
    }

    /// Hash cookie `name`; nothing is generated when it is absent (Envoy's
    /// cookie policy without `ttl`).
    pub fn cookie(name: &str) -> Result<Self, PolicyError> {
        if name.is_empty() {
            return Err(cfg_err("cookie.name", name, Problem::Missing));
        }
        if !is_token(name) {
            return Err(cfg_err("cookie.name", name, Problem::NotToken));
        }
        Ok(HashPolicy::new(Source::Cookie {
            name: name.to_string(),
            generate: None,
        }))
    }

    /// Hash the cookie named by `spec`, generating it when absent (Envoy's
    /// cookie policy with `ttl`; the spec's ttl, path and attributes shape
    /// the `Set-Cookie`, a zero ttl making it a session cookie).
    pub fn cookie_generated(spec: CookieSpec) -> Self {
        HashPolicy::new(Source::Cookie {
            name: spec.name().to_string(),
            generate: Some(spec),
        })
    }

    /// Hash the downstream IP address.
    pub fn source_ip() -> Self {
        HashPolicy::new(Source::SourceIp)
    }

    /// Hash query parameter `name`.
    pub fn query_parameter(name: &str) -> Result<Self, PolicyError> {
        if name.is_empty() {
            return Err(cfg_err("query_parameter.name", name, Problem::Missing));
        }
        Ok(HashPolicy::new(Source::QueryParameter {
            name: name.to_string(),
        }))
    }

    /// Hash the filter-state string stored under `key`.
    pub fn filter_state(key: &str) -> Result<Self, PolicyError> {
        if key.is_empty() {
            return Err(cfg_err("filter_state.key", key, Problem::Missing));
        }
        Ok(HashPolicy::new(Source::FilterState {
            key: key.to_string(),
        }))
    }

    fn new(source: Source) -> Self {
        HashPolicy {
            source,
            terminal: false,
        }
    }

    /// The same policy with `terminal` set.
    pub fn terminal(mut self, terminal: bool) -> Self {
        self.terminal = terminal;
        self
    }

    /// Where the policy reads from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Whether evaluation stops after this policy once a hash exists.
    pub fn is_terminal(&self) -> bool {
        self.terminal
    }
}

/// Read access to request headers kept in some other structure (a gRPC
/// metadata map, a proxy's header map).
pub trait HeaderLookup {
    /// Calls `f` with each value of header `name` (given lowercase; match it
    /// case-insensitively), in the order received.
    fn for_each_value(&self, name: &str, f: &mut dyn FnMut(&str));
}

/// A request's headers as the policies read them.
#[derive(Clone, Copy)]
pub enum Headers<'a> {
    /// `(name, value)` pairs, any name case, repeated names allowed.
    Pairs(&'a [(&'a str, &'a str)]),
    /// Owned `(name, value)` pairs (what a proxy-wasm host returns).
    Owned(&'a [(String, String)]),
    /// Any other header store.
    Lookup(&'a dyn HeaderLookup),
}

impl Headers<'_> {
    fn for_each_value(&self, name: &str, f: &mut dyn FnMut(&str)) {
        match self {
            Headers::Pairs(list) => list
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .for_each(|(_, v)| f(v)),
            Headers::Owned(list) => list
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                .for_each(|(_, v)| f(v)),
            Headers::Lookup(l) => l.for_each_value(name, f),
        }
    }
}

impl<'a> From<&'a [(&'a str, &'a str)]> for Headers<'a> {
    fn from(list: &'a [(&'a str, &'a str)]) -> Self {
        Headers::Pairs(list)
    }
}

impl<'a, const N: usize> From<&'a [(&'a str, &'a str); N]> for Headers<'a> {
    fn from(list: &'a [(&'a str, &'a str); N]) -> Self {
        Headers::Pairs(list)
    }
}

impl<'a> From<&'a Vec<(&'a str, &'a str)>> for Headers<'a> {
    fn from(list: &'a Vec<(&'a str, &'a str)>) -> Self {
        Headers::Pairs(list)
    }
}

impl<'a> From<&'a [(String, String)]> for Headers<'a> {
    fn from(list: &'a [(String, String)]) -> Self {
        Headers::Owned(list)
    }
}

impl<'a> From<&'a Vec<(String, String)>> for Headers<'a> {
    fn from(list: &'a Vec<(String, String)>) -> Self {
        Headers::Owned(list)
    }
}

impl<'a> From<&'a dyn HeaderLookup> for Headers<'a> {
    fn from(lookup: &'a dyn HeaderLookup) -> Self {
        Headers::Lookup(lookup)
    }
}

impl fmt::Debug for Headers<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Headers::Pairs(l) => f.debug_tuple("Pairs").field(l).finish(),
            Headers::Owned(l) => f.debug_tuple("Owned").field(l).finish(),
            Headers::Lookup(_) => f.write_str("Lookup(..)"),
        }
    }
}

/// What the policies see of a request, as plain values.
#[derive(Debug, Clone, Copy)]
pub struct HashRequest<'a> {
    /// All request headers (`Cookie` headers and pseudo-headers such as
    /// `:authority` included, for policies that name them).
    pub headers: Headers<'a>,
    /// `:path`, query string included.
    pub path: &'a str,
    /// The downstream peer's address (source IP; generated cookies).
    pub remote: Option<SocketAddr>,
    /// The address the downstream connection was accepted on (generated cookies).
    pub local: Option<SocketAddr>,
    /// Filter-state strings by key (`envoy.hashable_string` objects).
    pub filter_state: &'a [(&'a str, &'a str)],
    /// The value a generated cookie takes instead of Envoy's from `remote`
    /// and `local`: for a client, which has no downstream connection to
    /// derive it from. Must be a valid cookie value.
    pub generated: Option<&'a str>,
}

impl<'a> HashRequest<'a> {
    /// A request with these headers and nothing else known.
    pub fn new(headers: impl Into<Headers<'a>>) -> Self {
        HashRequest {
            headers: headers.into(),
            path: "",
            remote: None,
            local: None,
            filter_state: &[],
            generated: None,
        }
    }
}

/// The result of evaluating the policies for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    /// The request's hash, or `NoHash` (pick at random).
    pub hash: RequestHash,
    /// `Set-Cookie` values to add to the response (generated cookies).
    pub set_cookies: Vec<String>,
}

/// An ordered list of hash policies (a route's `hash_policy`).
#[derive(Debug, Clone, Default)]
pub struct HashPolicies {
    policies: Vec<HashPolicy>,
    peer: Peer,
}

impl HashPolicies {
    /// Policies evaluated with `peer`'s rules.
    pub fn new(policies: Vec<HashPolicy>, peer: Peer) -> Self {
        HashPolicies { policies, peer }
    }

    /// The policies, in order.
    pub fn policies(&self) -> &[HashPolicy] {
        &self.policies
    }

    /// Whose rules apply.
    pub fn peer(&self) -> Peer {
        self.peer
    }

    /// Evaluates the policies against `req`.
    pub fn evaluate(&self, req: &HashRequest<'_>) -> Evaluation {
        let mut hash = None;
        let mut set_cookies = Vec::new();
        for p in &self.policies {
            if let Some(h) = self.evaluate_one(p, req, &mut set_cookies) {
                hash = Some(combine(hash, h));
            }
            if p.terminal && hash.is_some() {
                break;
            }
        }
        Evaluation {
            hash: hash.map_or(RequestHash::NoHash, RequestHash::Hash),
            set_cookies,
        }
    }

    fn evaluate_one(
        &self,
        p: &HashPolicy,
        req: &HashRequest<'_>,
        set_cookies: &mut Vec<String>,
    ) -> Option<u64> {
        match (&p.source, self.peer) {
            (Source::Header(h), Peer::Envoy) => header_envoy(h, &req.headers),
            (Source::Header(h), Peer::Grpc | Peer::GrpcExtended) => header_grpc(h, &req.headers),
            (Source::Cookie { name, generate }, Peer::Envoy | Peer::GrpcExtended) => {
                cookie(name, generate.as_ref(), req, set_cookies)
            }
            (Source::SourceIp, Peer::Envoy) => {
                let mut text = IpText::default();
                // An IPv6 address prints in at most 45 bytes; cannot fail.
                let _ = write!(text, "{}", req.remote?.ip());
                Some(xxh64(text.as_bytes(), 0))
            }
            (Source::QueryParameter { name }, Peer::Envoy | Peer::GrpcExtended) => {
                query_parameter(req.path, name).map(|v| xxh64(v.as_bytes(), 0))
            }
            (Source::FilterState { key }, _) => req
                .filter_state
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| xxh64(v.as_bytes(), 0)),
            (
                Source::Cookie { .. } | Source::SourceIp | Source::QueryParameter { .. },
                Peer::Grpc,
            )
            | (Source::SourceIp, Peer::GrpcExtended) => None,
        }
    }
}

/// An IP address printed on the stack (the longest IPv6 text is 45 bytes).
struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl Default for IpText {
    fn default() -> Self {
        IpText {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl IpText {
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A value after the optional rewrite.
fn rewritten<'v>(_h: &HeaderSource, value: &'v str) -> alloc::borrow::Cow<'v, [u8]> {
    #[cfg(feature = "regex")]
    if let Some(r) = &_h.rewrite {
        return alloc::borrow::Cow::Owned(r.apply(value.as_bytes()));
    }
    alloc::borrow::Cow::Borrowed(value.as_bytes())
}

/// How many values header `h` has, and the hash of the first. Nearly every
/// request carries the header once: that value is hashed without
/// collecting or joining anything.
fn first_value_hash(h: &HeaderSource, headers: &Headers<'_>) -> (usize, Option<u64>) {
    let mut count = 0usize;
    let mut single = None;
    headers.for_each_value(&h.name, &mut |v| {
        count += 1;
        if count == 1 {
            single = Some(xxh64(&rewritten(h, v), 0));
        }
    });
    (count, single)
}

fn header_envoy(h: &HeaderSource, headers: &Headers<'_>) -> Option<u64> {
    let count = match first_value_hash(h, headers) {
        (count, single) if count <= 1 => return single,
        (count, _) => count,
    };
    let mut values: Vec<Vec<u8>> = Vec::with_capacity(count);
    headers.for_each_value(&h.name, &mut |v| values.push(rewritten(h, v).into_owned()));
    values.sort_unstable();
    Some(values.iter().fold(0u64, |seed, v| xxh64(v, seed)))
}

fn header_grpc(h: &HeaderSource, headers: &Headers<'_>) -> Option<u64> {
    if h.name.ends_with("-bin") {
        return None;
    }
    if let (0 | 1, single) = first_value_hash(h, headers) {
        return single;
    }
    let mut joined = String::new();
    let mut first = true;
    headers.for_each_value(&h.name, &mut |v| {
        if !core::mem::replace(&mut first, false) {
            joined.push(',');
        }
        joined.push_str(v);
    });
    Some(xxh64(&rewritten(h, &joined), 0))
}

fn cookie(
    name: &str,
    generate: Option<&CookieSpec>,
    req: &HashRequest<'_>,
    set_cookies: &mut Vec<String>,
) -> Option<u64> {
    // Outer: a cookie of that name was found; inner: its hash, if non-empty.
    let mut first: Option<Option<u64>> = None;
    req.headers.for_each_value("cookie", &mut |header| {
        if first.is_none() {
            if let Some(v) = cookie_header::find([header], name) {
                let v = strip_quotes(v);
                first = Some((!v.is_empty()).then(|| xxh64(v.as_bytes(), 0)));
            }
        }
    });
    // Envoy takes the first match even when empty, then treats an empty
    // value as no cookie.
    if let Some(Some(h)) = first {
        return Some(h);
    }
    let spec = generate?;
    let value = match req.generated {
        Some(v) => String::from(v),
        None => generated_value(req.remote?, req.local?),
    };
    // A 16-hex value always renders; the name was validated with the spec.
    if let Ok(set_cookie) = spec.render(&value, Style::Envoy) {
        set_cookies.push(set_cookie);
    }
    Some(xxh64(value.as_bytes(), 0))
}

fn strip_quotes(v: &str) -> &str {
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// The value Envoy generates for a connection: 16 lowercase hex digits of
/// XXH64(`remote + local`), both printed as `ip:port`.
pub fn generated_value(remote: SocketAddr, local: SocketAddr) -> String {
    let text = format!("{remote}{local}");
    format!("{:016x}", xxh64(text.as_bytes(), 0))
}

/// The first value of query parameter `name` in `path`, as Envoy's
/// `parseQueryString` reads it: after the first `?`, split on `&`, a
/// parameter without `=` has an empty value, nothing is percent-decoded.
pub fn query_parameter<'p>(path: &'p str, name: &str) -> Option<&'p str> {
    let (_, query) = path.split_once('?')?;
    query.split('&').find_map(|param| {
        let (n, v) = param.split_once('=').unwrap_or((param, ""));
        (n == name).then_some(v)
    })
}

/// Why a hash policy was rejected. Messages name the field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// A structural problem (missing, wrong type, unknown field, ...).
    Config(ConfigError),
    /// A `regex_rewrite` pattern or substitution that does not compile.
    Regex {
        /// `...regex_rewrite.pattern.regex` or `...regex_rewrite.substitution`.
        field: String,
        /// The text given.
        value: String,
        /// What is wrong with it.
        message: String,
    },
    /// `regex_rewrite` was given but tether-core was built without the
    /// `regex` feature.
    RegexDisabled {
        /// The field.
        field: String,
    },
}

impl PolicyError {
    fn within(self, parent: &str) -> Self {
        match self {
            PolicyError::Config(e) => PolicyError::Config(e.within(parent)),
            PolicyError::Regex {
                field,
                value,
                message,
            } => PolicyError::Regex {
                field: format!("{parent}.{field}"),
                value,
                message,
            },
            PolicyError::RegexDisabled { field } => PolicyError::RegexDisabled {
                field: format!("{parent}.{field}"),
            },
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::Config(e) => e.fmt(f),
            PolicyError::Regex {
                field,
                value,
                message,
            } => write!(f, "{field}: {value:?} {message}"),
            PolicyError::RegexDisabled { field } => write!(
                f,
                "{field}: regex rewrite needs tether-core's \"regex\" feature"
            ),
        }
    }
}

impl From<ConfigError> for PolicyError {
    fn from(e: ConfigError) -> Self {
        PolicyError::Config(e)
    }
}

fn cfg_err(field: &str, value: &str, problem: Problem) -> PolicyError {
    PolicyError::Config(ConfigError::new(field, value, problem))
}

impl HashPolicies {
    /// Parses a route's `hash_policy` list in Envoy's JSON form (snake_case
    /// field names), e.g.
    /// `[{"header": {"header_name": "x-user"}, "terminal": true},
    ///   {"cookie": {"name": "s", "ttl": "0s", "path": "/"}},
    ///   {"connection_properties": {"source_ip": true}},
    ///   {"query_parameter": {"name": "u"}}, {"filter_state": {"key": "k"}}]`.
    /// A `connection_properties` entry with `source_ip: false` is dropped,
    /// as Envoy drops it. Errors name the field as `[i].header.header_name`.
    pub fn from_json_value(value: &Value, peer: Peer) -> Result<Self, PolicyError> {
        let list = value
            .as_array()
            .ok_or_else(|| cfg_err("", &value.to_string(), Problem::WrongType("a list")))?;
        let mut policies = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            if let Some(p) = parse_policy(item).map_err(|e| e.within(&format!("[{i}]")))? {
                policies.push(p);
            }
        }
        Ok(HashPolicies::new(policies, peer))
    }

    /// [`HashPolicies::from_json_value`] for JSON text.
    pub fn from_json(text: &str, peer: Peer) -> Result<Self, PolicyError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| cfg_err("", "", Problem::Json(e.to_string())))?;
        HashPolicies::from_json_value(&value, peer)
    }
}

fn object<'a>(v: &'a Value, field: &str) -> Result<&'a Map<String, Value>, PolicyError> {
    v.as_object()
        .ok_or_else(|| cfg_err(field, &v.to_string(), Problem::WrongType("an object")))
}

fn only(o: &Map<String, Value>, parent: &str, known: &[&str]) -> Result<(), PolicyError> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(cfg_err(&join(parent, k), "", Problem::Unknown)),
        None => Ok(()),
    }
}

fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() {
        field.to_string()
    } else {
        format!("{parent}.{field}")
    }
}

fn string<'a>(
    o: &'a Map<String, Value>,
    parent: &str,
    field: &str,
) -> Result<&'a str, PolicyError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(cfg_err(
            &join(parent, field),
            &other.to_string(),
            Problem::WrongType("a string"),
        )),
    }
}

fn boolean(o: &Map<String, Value>, parent: &str, field: &str) -> Result<bool, PolicyError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(cfg_err(
            &join(parent, field),
            &other.to_string(),
            Problem::WrongType("true or false"),
        )),
    }
}

const SPECIFIERS: [&str; 5] = [
    "header",
    "cookie",
    "connection_properties",
    "query_parameter",
    "filter_state",
];

fn parse_policy(item: &Value) -> Result<Option<HashPolicy>, PolicyError> {
    let o = object(item, "")?;
    let mut known: Vec<&str> = SPECIFIERS.to_vec();
    known.push("terminal");
    only(o, "", &known)?;
    let terminal = boolean(o, "", "terminal")?;
    let mut given = SPECIFIERS.iter().filter(|s| o.contains_key(**s));
    let Some(&kind) = given.next() else {
        return Err(cfg_err("header", "", Problem::Missing));
    };
    if let Some(&other) = given.next() {
        return Err(cfg_err(other, "", Problem::Conflict(kind)));
    }
    let body = object(&o[kind], kind)?;
    let policy = match kind {
        "header" => {
            only(body, kind, &["header_name", "regex_rewrite"])?;
            let name = string(body, kind, "header_name")?;
            match body.get("regex_rewrite") {
                None | Some(Value::Null) => HashPolicy::header(name)?,
                Some(r) => header_with_rewrite(name, r)?,
            }
        }
        "cookie" => {
            let ttl_present = !matches!(body.get("ttl"), None | Some(Value::Null));
            let spec = config::cookie_spec(&o[kind]).map_err(|e| e.within(kind))?;
            if ttl_present {
                // Envoy keeps whole seconds of the ttl.
                let spec = CookieSpec::new(
                    spec.name(),
                    spec.path(),
                    Duration::from_secs(spec.ttl().as_secs()),
                    spec.attributes().to_vec(),
                )
                .map_err(|e| e.within(kind))?;
                HashPolicy::cookie_generated(spec)
            } else {
                HashPolicy::cookie(spec.name())?
            }
        }
        "connection_properties" => {
            only(body, kind, &["source_ip"])?;
            if !boolean(body, kind, "source_ip")? {
                return Ok(None);
            }
            HashPolicy::source_ip()
        }
        "query_parameter" => {
            only(body, kind, &["name"])?;
            HashPolicy::query_parameter(string(body, kind, "name")?)?
        }
        _ => {
            only(body, kind, &["key"])?;
            HashPolicy::filter_state(string(body, kind, "key")?)?
        }
    };
    Ok(Some(policy.terminal(terminal)))
}

#[cfg(feature = "regex")]
fn header_with_rewrite(name: &str, r: &Value) -> Result<HashPolicy, PolicyError> {
    let at = "header.regex_rewrite";
    let r = object(r, at)?;
    only(r, at, &["pattern", "substitution"])?;
    let pattern = match r.get("pattern") {
        None | Some(Value::Null) => "",
        Some(p) => {
            let p = object(p, &join(at, "pattern"))?;
            only(p, &join(at, "pattern"), &["regex", "google_re2"])?;
            string(p, &join(at, "pattern"), "regex")?
        }
    };
    if pattern.is_empty() {
        return Err(cfg_err(&join(at, "pattern.regex"), "", Problem::Missing));
    }
    let substitution = string(r, at, "substitution")?;
    let rewrite = Rewrite::new(pattern, substitution).map_err(|e| PolicyError::Regex {
        field: join(at, e.field()),
        value: e.value().to_string(),
        message: e.message().to_string(),
    })?;
    HashPolicy::header_rewritten(name, rewrite)
}

#[cfg(not(feature = "regex"))]
fn header_with_rewrite(_name: &str, _r: &Value) -> Result<HashPolicy, PolicyError> {
    Err(PolicyError::RegexDisabled {
        field: "header.regex_rewrite".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::key_hash;
    use alloc::vec;

    fn eval(policies: &HashPolicies, headers: &[(&str, &str)]) -> Evaluation {
        policies.evaluate(&HashRequest::new(headers))
    }

    fn envoy(list: Vec<HashPolicy>) -> HashPolicies {
        HashPolicies::new(list, Peer::Envoy)
    }

    #[test]
    fn header_hash_is_xxh64_of_the_value() {
        let p = envoy(vec![HashPolicy::header("X-User").unwrap()]);
        let e = eval(&p, &[("x-user", "foo")]);
        assert_eq!(e.hash, RequestHash::Hash(0x33bf00a859c4ba3f));
        assert!(e.set_cookies.is_empty());
        // Names match case-insensitively; an empty value is still a value.
        assert_eq!(
            eval(&p, &[("X-USER", "foo")]).hash,
            RequestHash::Hash(key_hash("foo"))
        );
        assert_eq!(
            eval(&p, &[("x-user", "")]).hash,
            RequestHash::Hash(0xef46db3751d8e999)
        );
        assert_eq!(eval(&p, &[("x-other", "foo")]).hash, RequestHash::NoHash);
    }

    #[test]
    fn repeated_headers_envoy_sorts_and_chains() {
        let p = envoy(vec![HashPolicy::header("x-user").unwrap()]);
        let chained = xxh64(b"foo", xxh64(b"bar", 0));
        let ab = eval(&p, &[("x-user", "foo"), ("x-user", "bar")]).hash;
        let ba = eval(&p, &[("x-user", "bar"), ("a", "b"), ("x-user", "foo")]).hash;
        assert_eq!(ab, RequestHash::Hash(chained));
        assert_eq!(ab, ba);
        assert_ne!(ab, RequestHash::Hash(key_hash("foo")));
    }

    #[test]
    fn repeated_headers_grpc_joins_with_comma() {
        let p = HashPolicies::new(vec![HashPolicy::header("x-user").unwrap()], Peer::Grpc);
        let e = eval(&p, &[("x-user", "foo"), ("x-user", "bar")]);
        assert_eq!(e.hash, RequestHash::Hash(key_hash("foo,bar")));
        let one = eval(&p, &[("x-user", "foo")]);
        assert_eq!(one.hash, RequestHash::Hash(key_hash("foo")));
        // An empty value still takes its place in the list.
        let empty_first = eval(&p, &[("x-user", ""), ("x-user", "bar"), ("x-user", "")]);
        assert_eq!(empty_first.hash, RequestHash::Hash(key_hash(",bar,")));
        let bin = HashPolicies::new(vec![HashPolicy::header("x-id-bin").unwrap()], Peer::Grpc);
        assert_eq!(
            eval(&bin, &[("x-id-bin", "AAE=")]).hash,
            RequestHash::NoHash
        );
    }

    #[test]
    fn policies_combine_in_order() {
        let p = envoy(vec![
            HashPolicy::header("a").unwrap(),
            HashPolicy::header("b").unwrap(),
        ]);
        let both = eval(&p, &[("a", "foo"), ("b", "bar")]).hash;
        assert_eq!(both, RequestHash::Hash(0x2fdd7dc01eaed227));
        let same = eval(&p, &[("a", "foo"), ("b", "foo")]).hash;
        assert_eq!(same, RequestHash::Hash(0x54c101f8ea4dce41));
        // Only the second present: its hash alone.
        assert_eq!(
            eval(&p, &[("b", "bar")]).hash,
            RequestHash::Hash(key_hash("bar"))
        );
        assert_eq!(eval(&p, &[]).hash, RequestHash::NoHash);
    }

    #[test]
    fn terminal_stops_once_a_hash_exists() {
        let p = envoy(vec![
            HashPolicy::header("a").unwrap().terminal(true),
            HashPolicy::header("b").unwrap(),
        ]);
        assert_eq!(
            eval(&p, &[("a", "foo"), ("b", "bar")]).hash,
            RequestHash::Hash(key_hash("foo"))
        );
        // The terminal policy found nothing: go on.
        assert_eq!(
            eval(&p, &[("b", "bar")]).hash,
            RequestHash::Hash(key_hash("bar"))
        );
        // A terminal policy after a hash already exists stops even if it
        // found nothing itself.
        let p = envoy(vec![
            HashPolicy::header("a").unwrap(),
            HashPolicy::header("b").unwrap().terminal(true),
            HashPolicy::header("c").unwrap(),
        ]);
        assert_eq!(
            eval(&p, &[("a", "foo"), ("c", "bar")]).hash,
            RequestHash::Hash(key_hash("foo"))
        );
    }

    #[test]
    fn cookie_first_match_quotes_removed() {
        let p = envoy(vec![HashPolicy::cookie("s").unwrap()]);
        let h = eval(&p, &[("cookie", "a=1; s=\"foo\""), ("cookie", "s=bar")]).hash;
        assert_eq!(h, RequestHash::Hash(key_hash("foo")));
        assert_eq!(eval(&p, &[("cookie", "a=1")]).hash, RequestHash::NoHash);
        // Empty counts as absent, and without ttl nothing is generated.
        assert_eq!(eval(&p, &[("cookie", "s=; s=x")]).hash, RequestHash::NoHash);
    }

    fn conn<'a>(headers: &'a [(&'a str, &'a str)]) -> HashRequest<'a> {
        let mut r = HashRequest::new(headers);
        r.remote = Some("127.0.0.1:54321".parse().unwrap());
        r.local = Some("127.0.0.1:10000".parse().unwrap());
        r
    }

    #[test]
    fn cookie_with_ttl_is_generated_and_rendered_by_the_one_renderer() {
        let spec = CookieSpec::new("hash", "/", Duration::ZERO, vec![]).unwrap();
        let p = envoy(vec![HashPolicy::cookie_generated(spec)]);
        let e = p.evaluate(&conn(&[]));
        let value = generated_value(
            "127.0.0.1:54321".parse().unwrap(),
            "127.0.0.1:10000".parse().unwrap(),
        );
        assert_eq!(
            value,
            format!("{:016x}", key_hash("127.0.0.1:54321127.0.0.1:10000"))
        );
        assert_eq!(value.len(), 16);
        assert_eq!(e.hash, RequestHash::Hash(key_hash(&value)));
        assert_eq!(
            e.set_cookies,
            [format!("hash=\"{value}\"; Path=/; HttpOnly")]
        );
        // Present: hashed, nothing generated.
        let e = p.evaluate(&conn(&[("cookie", "hash=\"abc\"")]));
        assert_eq!(e.hash, RequestHash::Hash(key_hash("abc")));
        assert!(e.set_cookies.is_empty());
        // No connection addresses: nothing to generate from.
        assert_eq!(
            p.evaluate(&HashRequest::new(&[] as &[(&str, &str)])).hash,
            RequestHash::NoHash
        );
    }

    #[test]
    fn grpc_extended_hashes_headers_as_grpc_and_cookies_and_queries_as_envoy() {
        let policies = |peer| {
            HashPolicies::new(
                vec![
                    HashPolicy::header("x-k").unwrap(),
                    HashPolicy::cookie("c").unwrap(),
                    HashPolicy::query_parameter("q").unwrap(),
                    HashPolicy::source_ip(),
                ],
                peer,
            )
        };
        let headers: &[(&str, &str)] = &[("x-k", "b"), ("x-k", "a"), ("cookie", "c=v")];
        let mut req = HashRequest::new(headers);
        req.path = "/p?q=z";
        req.remote = Some("10.0.0.1:1".parse().unwrap());
        let one =
            |peer, p: HashPolicy| HashPolicies::new(vec![p], peer).evaluate(&req).hash.value();
        let ext = Peer::GrpcExtended;
        assert_eq!(
            one(ext, HashPolicy::header("x-k").unwrap()),
            one(Peer::Grpc, HashPolicy::header("x-k").unwrap())
        );
        assert_ne!(
            one(ext, HashPolicy::header("x-k").unwrap()),
            one(Peer::Envoy, HashPolicy::header("x-k").unwrap()),
            "repeated values: joined, not sorted and chained"
        );
        for p in [
            HashPolicy::cookie("c").unwrap(),
            HashPolicy::query_parameter("q").unwrap(),
        ] {
            assert_eq!(one(ext, p.clone()), one(Peer::Envoy, p.clone()));
            assert!(one(ext, p.clone()).is_some());
            assert_eq!(one(Peer::Grpc, p), None);
        }
        assert_eq!(one(ext, HashPolicy::source_ip()), None);
        assert!(policies(ext).evaluate(&req).hash.value().is_some());
    }

    #[test]
    fn a_given_generated_value_replaces_the_addresses() {
        let spec = CookieSpec::new("aff", "/", Duration::from_secs(0), Vec::new()).unwrap();
        let p = envoy(vec![HashPolicy::cookie_generated(spec)]);
        let req = HashRequest {
            generated: Some("00112233aabbccdd"),
            ..HashRequest::new(&[] as &[(&str, &str)])
        };
        let e = p.evaluate(&req);
        assert_eq!(
            e.hash,
            RequestHash::Hash(xxh64(b"00112233aabbccdd", 0)),
            "the given value is hashed"
        );
        assert_eq!(e.set_cookies.len(), 1);
        assert!(
            e.set_cookies[0].starts_with("aff=\"00112233aabbccdd\""),
            "{:?}",
            e.set_cookies
        );
        // A present cookie still wins over generation.
        let present = HashRequest {
            generated: Some("00112233aabbccdd"),
            ..HashRequest::new(&[("cookie", "aff=abc")] as &[(&str, &str)])
        };
        let e = p.evaluate(&present);
        assert_eq!(e.hash, RequestHash::Hash(xxh64(b"abc", 0)));
        assert!(e.set_cookies.is_empty());
    }

    #[test]
    fn generated_cookie_with_max_age_and_attributes() {
        let json = r#"[{"cookie": {"name": "s", "ttl": "3600.9s", "path": "/app",
                        "attributes": [{"name": "SameSite", "value": "Lax"}, {"name": "Secure"}]}}]"#;
        let p = HashPolicies::from_json(json, Peer::Envoy).unwrap();
        let mut r = conn(&[]);
        r.remote = Some("[::1]:5000".parse().unwrap());
        r.local = Some("[::1]:10000".parse().unwrap());
        let e = p.evaluate(&r);
        let value = format!("{:016x}", key_hash("[::1]:5000[::1]:10000"));
        assert_eq!(
            e.set_cookies,
            [format!(
                "s=\"{value}\"; Max-Age=3600; Path=/app; SameSite=Lax; Secure; HttpOnly"
            )]
        );
    }

    #[test]
    fn source_ip_has_no_port() {
        let p = envoy(vec![HashPolicy::source_ip()]);
        let mut r = HashRequest::new(&[] as &[(&str, &str)]);
        assert_eq!(p.evaluate(&r).hash, RequestHash::NoHash);
        r.remote = Some("10.1.2.3:4444".parse().unwrap());
        assert_eq!(p.evaluate(&r).hash, RequestHash::Hash(key_hash("10.1.2.3")));
        r.remote = Some("[2001:db8::1]:4444".parse().unwrap());
        assert_eq!(
            p.evaluate(&r).hash,
            RequestHash::Hash(key_hash("2001:db8::1"))
        );
    }

    #[test]
    fn query_parameters_as_envoy_parses_them() {
        assert_eq!(query_parameter("/p?a=1&u=x%20y&u=2", "u"), Some("x%20y"));
        assert_eq!(query_parameter("/p?flag&b=2", "flag"), Some(""));
        assert_eq!(query_parameter("/p?a=1=2", "a"), Some("1=2"));
        assert_eq!(query_parameter("/p", "a"), None);
        assert_eq!(query_parameter("/p?x=1?a=2", "x"), Some("1?a=2"));
        let p = envoy(vec![HashPolicy::query_parameter("u").unwrap()]);
        let mut r = HashRequest::new(&[] as &[(&str, &str)]);
        r.path = "/cart?u=user-42";
        assert_eq!(p.evaluate(&r).hash, RequestHash::Hash(0x397e9d3a76af7c81));
    }

    #[test]
    fn filter_state_hashes_the_string() {
        let p = envoy(vec![HashPolicy::filter_state("tether.key").unwrap()]);
        let mut r = HashRequest::new(&[] as &[(&str, &str)]);
        r.filter_state = &[("other", "x"), ("tether.key", "user-42")];
        assert_eq!(p.evaluate(&r).hash, RequestHash::Hash(key_hash("user-42")));
    }

    #[test]
    fn grpc_ignores_cookie_ip_and_query() {
        let p = HashPolicies::new(
            vec![
                HashPolicy::cookie("s").unwrap(),
                HashPolicy::source_ip(),
                HashPolicy::query_parameter("u").unwrap(),
            ],
            Peer::Grpc,
        );
        let mut r = conn(&[("cookie", "s=1")]);
        r.path = "/?u=1";
        assert_eq!(p.evaluate(&r).hash, RequestHash::NoHash);
    }

    #[test]
    fn string_headers_work_too() {
        let owned = vec![("X-User".to_string(), "foo".to_string())];
        let p = envoy(vec![HashPolicy::header("x-user").unwrap()]);
        let r = HashRequest::new(&owned);
        assert_eq!(p.evaluate(&r).hash, RequestHash::Hash(key_hash("foo")));
    }

    #[test]
    fn parses_envoy_json() {
        let p = HashPolicies::from_json(
            r#"[{"header": {"header_name": "x-user"}, "terminal": true},
                {"cookie": {"name": "s"}},
                {"connection_properties": {"source_ip": false}},
                {"connection_properties": {"source_ip": true}},
                {"query_parameter": {"name": "u"}},
                {"filter_state": {"key": "k"}}]"#,
            Peer::Envoy,
        )
        .unwrap();
        assert_eq!(p.policies().len(), 5, "source_ip false is dropped");
        assert!(p.policies()[0].is_terminal());
        assert!(matches!(
            p.policies()[1].source(),
            Source::Cookie { generate: None, .. }
        ));
        assert!(matches!(p.policies()[2].source(), Source::SourceIp));
        let Source::Header(h) = p.policies()[0].source() else {
            panic!("header")
        };
        assert_eq!(h.name(), "x-user");
    }

    #[test]
    fn json_errors_name_field_and_value() {
        let err = |j: &str| {
            HashPolicies::from_json(j, Peer::Envoy)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(r#"[{"header": {}}]"#),
            "[0].header.header_name: field not present"
        );
        assert_eq!(
            err(r#"[{"terminal": true}, {"header": {"header_name": "a b"}}]"#),
            "[0].header: field not present"
        );
        assert_eq!(
            err(r#"[{"header": {"header_name": "a b"}}]"#),
            "[0].header.header_name: \"a b\" is not a valid name (RFC 9110 token characters only)"
        );
        assert_eq!(
            err(r#"[{"header": {"header_name": "a"}, "cookie": {"name": "s"}}]"#),
            "[0].cookie: cannot be combined with header"
        );
        assert_eq!(
            err(r#"[{"cookie": {"name": "s", "ttl": "-1s"}}]"#),
            "[0].cookie.ttl: \"-1s\" is negative"
        );
        assert_eq!(
            err(r#"[{"query_parameter": {"name": 5}}]"#),
            "[0].query_parameter.name: 5 is not a string"
        );
        assert_eq!(
            err(r#"[{"filter_state": {"key": "k", "x": 1}}]"#),
            "[0].filter_state.x: is not a known field"
        );
        assert_eq!(err(r#"{}"#), "configuration: {} is not a list");
        assert_eq!(
            err(r#"[{"header": {"header_name": "a"}, "terminal": "yes"}]"#),
            "[0].terminal: \"yes\" is not true or false"
        );
    }

    #[cfg(not(feature = "regex"))]
    #[test]
    fn regex_rewrite_needs_the_feature() {
        let e = HashPolicies::from_json(
            r#"[{"header": {"header_name": "a", "regex_rewrite": {"pattern": {"regex": "x"}, "substitution": "y"}}}]"#,
            Peer::Envoy,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "[0].header.regex_rewrite: regex rewrite needs tether-core's \"regex\" feature"
        );
    }

    #[cfg(feature = "regex")]
    #[test]
    fn regex_rewrite_before_hashing() {
        let p = HashPolicies::from_json(
            r#"[{"header": {"header_name": ":path",
                 "regex_rewrite": {"pattern": {"google_re2": {}, "regex": "^/users/([0-9]+)/.*$"}, "substitution": "\\1"}}}]"#,
            Peer::Envoy,
        )
        .unwrap();
        let e = eval(&p, &[(":path", "/users/42/cart")]);
        assert_eq!(e.hash, RequestHash::Hash(key_hash("42")));
        let err = HashPolicies::from_json(
            r#"[{"header": {"header_name": "a", "regex_rewrite": {"pattern": {"regex": "("}}}}]"#,
            Peer::Envoy,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("[0].header.regex_rewrite.pattern.regex: \"(\" is not a valid regex"),
            "{err}"
        );
        let err = HashPolicies::from_json(
            r#"[{"header": {"header_name": "a", "regex_rewrite": {"pattern": {"regex": "a"}, "substitution": "\\1"}}}]"#,
            Peer::Envoy,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "[0].header.regex_rewrite.substitution: \"\\\\1\" refers to group 1 but the pattern has 0"
        );
    }
}
