//! Call credentials for the xDS stream (gRFC A97): the bootstrap's
//! `call_creds`, of which tether supports `jwt_token_file`.
//!
//! [`JwtTokenFile`] reads a JWT from a file when a stream starts and sends it
//! as `authorization: Bearer <token>`. The token is cached until 30 s before
//! its `exp` (clock skew), read again when it is within a minute of that or
//! when the file changed, and after a failed read the file is not read again
//! before a backoff delay; a stream starting meanwhile fails with the last
//! error. A file that cannot be read fails the stream UNAVAILABLE; a token
//! whose `exp` cannot be read fails it UNAUTHENTICATED (as C-core does).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde_json::Value;
use tokio::time::Instant;

use crate::backoff::{Backoff, BackoffConfig};
use crate::bootstrap::BootstrapError;

/// Taken off the token's `exp` for clock skew and the server's time.
const SKEW: Duration = Duration::from_secs(30);
/// A cached token this close to its (skewed) expiry is read again.
const REFRESH: Duration = Duration::from_secs(60);

/// The environment variable C-core guards A97's bootstrap field with.
pub const ENV: &str = "GRPC_EXPERIMENTAL_XDS_BOOTSTRAP_CALL_CREDS";

/// Whether [`ENV`] is set to a true value (`true`, `yes`, `1`, any case).
pub fn enabled_from_env() -> bool {
    crate::env::flag(ENV)
}

/// The call credentials a bootstrap's server lists that tether supports
/// (every supported entry applies; others are ignored, as gRPC does).
/// `field` names the server (`xds_servers[0]`).
pub fn from_bootstrap(
    list: &[(String, Value)],
    field: &str,
) -> Result<Vec<JwtTokenFile>, BootstrapError> {
    let mut out = Vec::new();
    for (i, (kind, config)) in list.iter().enumerate() {
        if kind != "jwt_token_file" {
            continue;
        }
        let at = format!("{field}.call_creds[{i}].config.jwt_token_file");
        match config.get("jwt_token_file") {
            Some(Value::String(p)) if !p.is_empty() => out.push(JwtTokenFile::new(p)),
            Some(other) => {
                return Err(BootstrapError::new(
                    &at,
                    &other.to_string(),
                    "is not a file path",
                ))
            }
            None => return Err(BootstrapError::new(&at, "", "field not present")),
        }
    }
    Ok(out)
}

/// gRFC A97's JWT token file call credentials.
pub struct JwtTokenFile {
    path: PathBuf,
    state: Mutex<State>,
}

/// The file, never the token: a Debug string ends up in logs.
impl std::fmt::Debug for JwtTokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("JwtTokenFile")
            .field("path", &self.path)
            .field("token", &s.cached.as_ref().map(|_| "<redacted>"))
            .field("until", &s.cached.as_ref().map(|c| c.1))
            .field("failed", &s.failed.as_ref().map(|f| f.1.message()))
            .finish()
    }
}

struct State {
    /// The token, until when it may be used, and the file's mtime it came from.
    cached: Option<(String, SystemTime, Option<SystemTime>)>,
    backoff: Backoff,
    /// After a failed read: no new read before then; the error meanwhile.
    failed: Option<(Instant, tonic::Status)>,
}

impl JwtTokenFile {
    /// Credentials reading the token in `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        JwtTokenFile {
            path: path.into(),
            state: Mutex::new(State {
                cached: None,
                backoff: Backoff::new(BackoffConfig::default()),
                failed: None,
            }),
        }
    }

    /// The token file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `authorization` value for a stream starting now: `Bearer <token>`,
    /// or the status the stream fails with.
    pub fn authorization(&self) -> Result<String, tonic::Status> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = SystemTime::now();
        let mtime = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if let Some((token, until, read_at)) = &s.cached {
            let fresh = now < *until;
            let soon = until
                .duration_since(now)
                .map_or(true, |left| left < REFRESH);
            if fresh && !soon && *read_at == mtime {
                return Ok(format!("Bearer {token}"));
            }
            if fresh {
                // Read again ahead of expiry (or because the file changed);
                // the cached token still serves if that fails.
                let token = token.clone();
                return Ok(match self.read(&mut s, mtime) {
                    Ok(t) => format!("Bearer {t}"),
                    Err(_) => format!("Bearer {token}"),
                });
            }
        }
        if let Some((until, status)) = &s.failed {
            if Instant::now() < *until {
                return Err(status.clone());
            }
        }
        self.read(&mut s, mtime).map(|t| format!("Bearer {t}"))
    }

    fn read(&self, s: &mut State, mtime: Option<SystemTime>) -> Result<String, tonic::Status> {
        match read_token(&self.path) {
            Ok((token, exp)) => {
                let until = exp.checked_sub(SKEW).unwrap_or(UNIX_EPOCH);
                // C-core sends a token that has expired and leaves the
                // verdict to the server (re-reading the file for each new
                // stream); the operator is told once per read.
                if exp <= SystemTime::now() {
                    log::warn!(
                        "xDS call credentials: the JWT in {} expired at {} (UNIX time); sent \
                         anyway, as C-core does, and read again for the next stream",
                        self.path.display(),
                        exp.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
                    );
                }
                s.cached = Some((token.clone(), until, mtime));
                s.failed = None;
                s.backoff.reset();
                Ok(token)
            }
            Err(status) => {
                log::warn!("xDS call credentials: {}", status.message());
                let delay = s.backoff.next_delay();
                s.failed = Some((Instant::now() + delay, status.clone()));
                Err(status)
            }
        }
    }
}

/// The token in `path` and its `exp` (epoch seconds).
fn read_token(path: &Path) -> Result<(String, SystemTime), tonic::Status> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        tonic::Status::unavailable(format!(
            "reading the JWT token file {}: {e}",
            path.display()
        ))
    })?;
    let token = text.trim().to_owned();
    let invalid = |why: String| {
        tonic::Status::unauthenticated(format!(
            "the JWT token in {} is invalid: {why}",
            path.display()
        ))
    };
    let exp = jwt_exp(&token).map_err(invalid)?;
    // Checked: an `exp` past what the clock holds (1e19) is an invalid
    // token, as C-core fails to parse it, not a panic.
    let exp = UNIX_EPOCH
        .checked_add(Duration::from_secs(exp))
        .ok_or_else(|| invalid(format!("exp {exp} is past any time this clock can hold")))?;
    Ok((token, exp))
}

/// The `exp` claim of a JWT (its payload is not verified: the server does).
pub fn jwt_exp(token: &str) -> Result<u64, String> {
    let mut parts = token.split('.');
    let (Some(_), Some(payload), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not three dot-separated parts".into());
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("its payload is not base64url: {e}"))?;
    let claims: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("its payload is not JSON: {e}"))?;
    match claims.get("exp") {
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64))
            .ok_or_else(|| format!("exp {n} is not a time")),
        Some(other) => Err(format!("exp {other} is not a number")),
        None => Err("no exp claim".into()),
    }
}

/// Adds `creds`' `authorization` headers to a new stream's metadata; a
/// channel that is not TLS gets none, and the stream fails
/// UNAUTHENTICATED as in gRPC.
pub(crate) fn authorize(
    creds: &[JwtTokenFile],
    secure: bool,
    metadata: &mut tonic::metadata::MetadataMap,
) -> Result<(), tonic::Status> {
    if creds.is_empty() {
        return Ok(());
    }
    if !secure {
        return Err(tonic::Status::unauthenticated(
            "Established channel does not have a sufficient security level to transfer call \
             credential.",
        ));
    }
    for c in creds {
        let value = c.authorization()?;
        let value = value.parse().map_err(|_| {
            tonic::Status::unauthenticated(format!(
                "the JWT token in {} is not a valid header value",
                c.path().display()
            ))
        })?;
        metadata.append("authorization", value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.{}",
            b64(r#"{"alg":"none"}"#),
            b64(payload),
            b64("sig")
        )
    }

    #[test]
    fn exp_is_read_from_the_payload() {
        assert_eq!(jwt_exp(&jwt(r#"{"exp":1800000000}"#)), Ok(1_800_000_000));
        assert_eq!(jwt_exp(&jwt(r#"{"exp":1800000000.5}"#)), Ok(1_800_000_000));
        assert_eq!(jwt_exp(&jwt(r#"{"sub":"x"}"#)), Err("no exp claim".into()));
        assert_eq!(
            jwt_exp(&jwt(r#"{"exp":"soon"}"#)),
            Err(r#"exp "soon" is not a number"#.into())
        );
        assert_eq!(
            jwt_exp("only.two"),
            Err("not three dot-separated parts".into())
        );
        assert!(jwt_exp("a.!!!.c").unwrap_err().contains("base64url"));
    }

    #[test]
    fn the_token_is_cached_and_read_again_when_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("tether-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let first = jwt(&format!(r#"{{"exp":{exp},"n":1}}"#));
        std::fs::write(&path, format!("{first}\n")).unwrap();
        let creds = JwtTokenFile::new(&path);
        assert_eq!(creds.authorization().unwrap(), format!("Bearer {first}"));
        // Rewritten with a new token (and a later mtime): read again.
        let second = jwt(&format!(r#"{{"exp":{exp},"n":2}}"#));
        std::fs::write(&path, &second).unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(creds.authorization().unwrap(), format!("Bearer {second}"));
        // Gone: the cached token still serves until it expires.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(creds.authorization().unwrap(), format!("Bearer {second}"));
        // Expired, no file: UNAVAILABLE; an invalid token: UNAUTHENTICATED.
        let expired = JwtTokenFile::new(&path);
        assert_eq!(
            expired.authorization().unwrap_err().code(),
            tonic::Code::Unavailable
        );
        std::fs::write(&path, "not-a-jwt").unwrap();
        let invalid = JwtTokenFile::new(&path);
        assert_eq!(
            invalid.authorization().unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // In backoff after that failure, a good file is not read yet.
        std::fs::write(&path, &first).unwrap();
        assert_eq!(
            invalid.authorization().unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn token_file(name: &str, contents: &str) -> (PathBuf, JwtTokenFile) {
        let dir = std::env::temp_dir().join(format!("tether-jwt-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, contents).unwrap();
        (dir, JwtTokenFile::new(&path))
    }

    /// `exp` = 1e19 is past what SystemTime holds: an invalid token
    /// (UNAUTHENTICATED, as C-core fails to parse it), not a panic of the
    /// XdsClient's task.
    #[test]
    fn an_exp_past_the_clock_is_an_invalid_token() {
        for exp in ["1e19", "10000000000000000000", "18446744073709551615"] {
            let (dir, creds) = token_file("huge", &jwt(&format!(r#"{{"exp":{exp}}}"#)));
            let e = creds.authorization().unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{exp}: {e:?}");
            assert!(
                e.message().contains("is past any time this clock can hold"),
                "{exp}: {e:?}"
            );
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// An expired token is sent as C-core sends it (the server judges it),
    /// and the file is read again for the next stream: a renewed token is
    /// picked up at once.
    #[test]
    fn an_expired_token_is_sent_and_read_again() {
        let expired = jwt(r#"{"exp":1000000000}"#);
        let (dir, creds) = token_file("expired", &expired);
        assert_eq!(creds.authorization().unwrap(), format!("Bearer {expired}"));
        let renewed = jwt(r#"{"exp":99999999999}"#);
        std::fs::write(dir.join("token"), &renewed).unwrap();
        assert_eq!(creds.authorization().unwrap(), format!("Bearer {renewed}"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Neither Debug nor an error carries the token.
    #[test]
    fn the_token_stays_out_of_debug_and_errors() {
        let secret = "s3cr3t-claim-value";
        let token = jwt(&format!(r#"{{"exp":99999999999,"sub":"{secret}"}}"#));
        let (dir, creds) = token_file("redact", &token);
        creds.authorization().unwrap();
        let debug = format!("{creds:?}");
        assert!(debug.contains("<redacted>"), "{debug}");
        assert!(
            !debug.contains(&token) && !debug.contains(secret),
            "{debug}"
        );
        // Invalid tokens: the error names the file and the reason only.
        for bad in [
            format!("{token}.extra"),
            jwt(&format!(r#"{{"sub":"{secret}"}}"#)),
            jwt(&format!(r#"{{"exp":true,"sub":"{secret}"}}"#)),
        ] {
            std::fs::write(dir.join("token"), &bad).unwrap();
            let creds = JwtTokenFile::new(dir.join("token"));
            let e = creds.authorization().unwrap_err();
            let text = format!("{e:?} {e} {creds:?}");
            assert!(!text.contains(&bad) && !text.contains(&token), "{text}");
            assert!(!text.contains(secret), "{text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
