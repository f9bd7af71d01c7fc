//! Reloading the configuration file: on every change of its content (checked
//! every poll interval) and on SIGHUP. A file that does not parse or validate
//! is rejected with an error naming the field and, where the field is
//! written in the file, its line; the last good snapshot keeps being served.
//! The endpoints' DNS names are resolved here too: a new name before its
//! file is served (one that does not resolve rejects the file, naming the
//! field and the answer), then each when it is due, the file translated
//! again when an address changed. The run loop also removes DRAINING
//! endpoints whose service's `drain` says so, when they come due.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

use super::dns::{Answer, DnsSettings, DnsStatus, Lookup, NameState, Names, Resolved};
use super::model::{Config, ModelError, NameUse, Overrides};
use super::server::ControlPlane;
use super::session_keys;
use super::translate::{translate_with, Translated};

/// Why a configuration file could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The file could not be read.
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The file's content is wrong.
    Model {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the field.
        error: ModelError,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            LoadError::Model { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for LoadError {}

/// Reads and validates a configuration file.
pub fn load(path: &Path) -> Result<(Config, String), LoadError> {
    load_with(path, &Overrides::default())
}

/// Reads a configuration file, applies `overrides` and validates it.
pub fn load_with(path: &Path, overrides: &Overrides) -> Result<(Config, String), LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoadError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    let mut config = Config::parse_with(&text, overrides).map_err(|error| LoadError::Model {
        path: path.to_owned(),
        error,
    })?;
    load_keys(&mut config, path, &text)?;
    for note in config.session_notes() {
        log::info!("{}: {note}", path.display());
    }
    Ok((config, text))
}

/// Reads the key files `config` names (relative to `path`'s directory)
/// into it, and warns about peers that cannot read its sealed cookies.
fn load_keys(config: &mut Config, path: &Path, text: &str) -> Result<(), LoadError> {
    session_keys::load(config, &key_base(path)).map_err(|error| LoadError::Model {
        path: path.to_owned(),
        error: error.located_in(text),
    })?;
    for warning in config.session_warnings() {
        log::warn!("{}: {warning}", path.display());
    }
    Ok(())
}

/// The directory key files are relative to: the configuration file's.
fn key_base(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The file's content did not change.
    Unchanged,
    /// A new version is served (or the same one, if the resources did not change).
    Published(u64),
    /// The file was rejected; the last good snapshot is still served.
    Rejected(LoadError),
}

/// Watches one file and publishes its translation to a control plane; it
/// also resolves the names the endpoints use and publishes their changes.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    plane: ControlPlane,
    last_text: Option<String>,
    /// The key files of the last file read, as they were: a change is a
    /// reload (key rotation).
    last_keys: BTreeMap<PathBuf, Option<String>>,
    overrides: Overrides,
    /// The file being served, translated again when a name's addresses
    /// change.
    config: Option<Config>,
    names: Names,
    settings: DnsSettings,
    /// The resolver of the refreshes, made on the runtime that runs them.
    lookup: Option<Lookup>,
    /// The addresses last translated.
    published: Resolved,
    status: watch::Sender<DnsStatus>,
}

/// A new file, parsed, with the names it adds.
struct Candidate {
    config: Config,
    text: String,
    settings: DnsSettings,
    new_names: Vec<NameUse>,
}

impl Reloader {
    /// Loads `path` (which must be valid) and returns the control plane
    /// serving it with the reloader that keeps it current.
    pub fn start(path: &Path) -> Result<(ControlPlane, Reloader), LoadError> {
        Reloader::start_with(path, Overrides::default())
    }

    /// As [`Reloader::start`], with `overrides` (command-line settings)
    /// applied to every version of the file.
    ///
    /// When endpoints are written as `NAME:PORT`, the names are resolved
    /// first, on a thread of their own, and this waits for the answers
    /// (bounded by `dns.timeout`); a name that does not resolve fails the
    /// start. Called from a runtime's task, that task's worker waits too.
    pub fn start_with(
        path: &Path,
        overrides: Overrides,
    ) -> Result<(ControlPlane, Reloader), LoadError> {
        let (config, text) = load_with(path, &overrides)?;
        let mut reloader = Reloader {
            last_text: Some(text.clone()),
            last_keys: session_keys::snapshot(&config, &key_base(path)),
            overrides,
            // The plane is replaced below by the one serving the file's
            // first version.
            ..Reloader::new(path, ControlPlane::new(Translated::default()))
        };
        let candidate = reloader.candidate(config, text);
        let answers = resolve_blocking(&candidate.settings, &hosts(&candidate.new_names));
        let plane = ControlPlane::new(reloader.adopt(candidate, answers)?);
        reloader.plane = plane.clone();
        Ok((plane, reloader))
    }

    /// Wraps an existing control plane; the first [`Reloader::reload`] loads the file.
    pub fn new(path: &Path, plane: ControlPlane) -> Self {
        Reloader {
            path: path.to_owned(),
            plane,
            last_text: None,
            last_keys: BTreeMap::new(),
            overrides: Overrides::default(),
            config: None,
            names: Names::new(),
            settings: DnsSettings::default(),
            lookup: None,
            published: Resolved::default(),
            status: watch::channel(DnsStatus::new()).0,
        }
    }

    /// Where each name the file uses stands (its addresses, failures, an
    /// outage), updated after every resolution; for operators and tests.
    pub fn dns_status(&self) -> watch::Receiver<DnsStatus> {
        self.status.subscribe()
    }

    /// Re-reads the file; publishes it when its content changed and is
    /// valid. New names are resolved first, as in [`Reloader::start_with`].
    pub fn reload(&mut self) -> Reload {
        let candidate = match self.read() {
            Ok(Some(c)) => c,
            Ok(None) => return Reload::Unchanged,
            Err(e) => return Reload::Rejected(e),
        };
        let answers = resolve_blocking(&candidate.settings, &hosts(&candidate.new_names));
        match self.adopt(candidate, answers) {
            Ok(t) => Reload::Published(self.plane.publish(t)),
            Err(e) => Reload::Rejected(e),
        }
    }

    /// As [`Reloader::reload`], resolving new names on this runtime.
    async fn reload_async(&mut self) -> Reload {
        let candidate = match self.read() {
            Ok(Some(c)) => c,
            Ok(None) => return Reload::Unchanged,
            Err(e) => return Reload::Rejected(e),
        };
        let new = hosts(&candidate.new_names);
        let answers = if new.is_empty() {
            Vec::new()
        } else {
            match Lookup::new(&candidate.settings) {
                Ok(lookup) => resolve_all(&lookup, &new).await,
                Err(reason) => failed_all(&new, &reason),
            }
        };
        match self.adopt(candidate, answers) {
            Ok(t) => Reload::Published(self.plane.publish(t)),
            Err(e) => Reload::Rejected(e),
        }
    }

    /// The file, when its content changed and is valid (`None`: unchanged).
    fn read(&mut self) -> Result<Option<Candidate>, LoadError> {
        let text = std::fs::read_to_string(&self.path).map_err(|e| LoadError::Io {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        if self.last_text.as_deref() == Some(text.as_str())
            && session_keys::unchanged(&self.last_keys)
        {
            return Ok(None);
        }
        // Remember bad content too, so it is reported once, not every poll.
        self.last_text = Some(text.clone());
        let mut config =
            Config::parse_with(&text, &self.overrides).map_err(|error| LoadError::Model {
                path: self.path.clone(),
                error,
            })?;
        self.last_keys = session_keys::snapshot(&config, &key_base(&self.path));
        load_keys(&mut config, &self.path, &text)?;
        Ok(Some(self.candidate(config, text)))
    }

    fn candidate(&self, config: Config, text: String) -> Candidate {
        let settings = config.dns.settings();
        let new_names = config
            .dns_names()
            .into_iter()
            .filter(|n| !self.names.contains(&n.host))
            .collect();
        Candidate {
            config,
            text,
            settings,
            new_names,
        }
    }

    /// Takes `c` once each new name has an address (`answers`, by name)
    /// and returns its translation to serve; else the error names the
    /// first name that has none, its field and its answer, and nothing
    /// changes.
    fn adopt(
        &mut self,
        c: Candidate,
        answers: Vec<(String, Answer)>,
    ) -> Result<Translated, LoadError> {
        let now = now();
        let mut states = Vec::new();
        for name in &c.new_names {
            let answer = answers
                .iter()
                .find(|(h, _)| *h == name.host)
                .map(|(_, a)| a.clone())
                .unwrap_or_else(|| Answer::Failed {
                    reason: "not asked".to_owned(),
                });
            match NameState::first(&answer, now, &c.settings) {
                Ok(state) => states.push((name.host.clone(), state)),
                Err(answer) => {
                    let error = ModelError::invalid(
                        &name.field,
                        &name.value,
                        format!(
                            "does not resolve: {} answered {answer}",
                            servers_of(&c.settings)
                        ),
                    )
                    .located_in(&c.text);
                    return Err(LoadError::Model {
                        path: self.path.clone(),
                        error,
                    });
                }
            }
        }
        for (host, state) in states {
            log::info!(
                "DNS name {host:?} resolves to {}",
                state
                    .addresses()
                    .iter()
                    .map(|(ip, _)| ip.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            self.names.insert(host, state);
        }
        let used: BTreeSet<String> = c.config.dns_names().into_iter().map(|n| n.host).collect();
        self.names.retain(&used);
        if c.settings != self.settings {
            self.lookup = None;
            self.settings = c.settings;
        }
        self.published = self.names.resolved();
        let translated = translate_with(&c.config, &self.published);
        self.config = Some(c.config);
        self.status.send_replace(self.names.report());
        Ok(translated)
    }

    /// Resolves the names that are due, ends the draining windows that
    /// are over, and publishes the file again when an address changed.
    async fn refresh(&mut self) {
        self.names.expire(now());
        let due = self.names.due(now());
        if !due.is_empty() {
            let answers = match self.lookup() {
                Ok(lookup) => resolve_all(&lookup, &due).await,
                Err(reason) => failed_all(&due, &reason),
            };
            let at = now();
            for (host, answer) in &answers {
                self.names.apply(host, answer, at, &self.settings);
            }
        }
        self.status.send_replace(self.names.report());
        let resolved = self.names.resolved();
        if resolved == self.published {
            return;
        }
        self.published = resolved;
        if let Some(config) = &self.config {
            let version = self.plane.publish(translate_with(config, &self.published));
            log::info!("DNS answers changed endpoints: serving version {version}");
        }
    }

    fn lookup(&mut self) -> Result<Lookup, String> {
        if let Some(l) = &self.lookup {
            return Ok(l.clone());
        }
        let l = Lookup::new(&self.settings)?;
        self.lookup = Some(l.clone());
        Ok(l)
    }

    /// Polls the file every `interval` (the first poll one interval from
    /// now: the file was just loaded) and reloads on SIGHUP, forever,
    /// reporting each outcome to `report`; resolves the endpoints' names
    /// when they are due (their TTL within `dns.minRefresh` and
    /// `dns.maxRefresh`) and publishes their changes; removes DRAINING
    /// endpoints from EDS when their service's `drain` says
    /// ([`ControlPlane::enforce_drains`]), woken by a timer for the next
    /// removal due and by any event that may bring one sooner. The SIGHUP
    /// handler is installed before this returns, so a signal sent once it
    /// has returned is never lost (nor, by default, fatal). Must be called
    /// within a Tokio runtime.
    pub fn run(
        mut self,
        interval: Duration,
        mut report: impl FnMut(&Reload) + Send + 'static,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        #[cfg(unix)]
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let dns_due = self.names.next_deadline();
                let dns = async move {
                    match dns_due {
                        Some(at) => tokio::time::sleep_until(at.into()).await,
                        None => std::future::pending().await,
                    }
                };
                // Removals run on the load state's clock (std's); a verdict
                // that turns idle, or a drain that begins, wakes the loop
                // to look again.
                let drain_due = self.plane.next_drain_deadline();
                let drain_timer = async move {
                    match drain_due {
                        Some(at) => {
                            let wait = at.saturating_duration_since(std::time::Instant::now());
                            tokio::time::sleep(wait).await
                        }
                        None => std::future::pending().await,
                    }
                };
                let notify = self.plane.drain_wake();
                let drain_changed = notify.notified();
                #[cfg(unix)]
                let wake = tokio::select! {
                    _ = tick.tick() => Wake::Poll,
                    Some(()) = recv_opt(&mut hup) => Wake::Hangup,
                    () = dns => Wake::Dns,
                    () = drain_timer => Wake::Drain,
                    () = drain_changed => Wake::Drain,
                };
                #[cfg(not(unix))]
                let wake = tokio::select! {
                    _ = tick.tick() => Wake::Poll,
                    () = dns => Wake::Dns,
                    () = drain_timer => Wake::Drain,
                    () = drain_changed => Wake::Drain,
                };
                match wake {
                    Wake::Dns => self.refresh().await,
                    Wake::Drain => {
                        self.plane.enforce_drains(std::time::Instant::now());
                    }
                    Wake::Poll | Wake::Hangup => {
                        if wake == Wake::Hangup {
                            // A signal re-reads even unchanged content.
                            self.last_text = None;
                        }
                        let outcome = self.reload_async().await;
                        if outcome != Reload::Unchanged {
                            report(&outcome);
                        }
                    }
                }
            }
        }
    }
}

/// Why the run loop woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Poll,
    Hangup,
    Dns,
    /// A DRAINING endpoint may be due for removal.
    Drain,
}

/// The time on Tokio's clock (paused in tests that pause it).
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// Whom a resolver of `settings` asks, for messages.
fn servers_of(settings: &DnsSettings) -> String {
    if settings.servers.is_empty() {
        "the system's DNS servers (resolv.conf)".to_owned()
    } else {
        let list: Vec<String> = settings.servers.iter().map(|s| s.to_string()).collect();
        list.join(", ")
    }
}

fn hosts(names: &[NameUse]) -> Vec<String> {
    names.iter().map(|n| n.host.clone()).collect()
}

/// Queries in flight at once: a thousand names due together would
/// otherwise burst a thousand UDP queries at the servers, and an answer
/// dropped in that burst costs a whole `timeout` before its retry.
const IN_FLIGHT: usize = 64;

/// Resolves every name of `hosts`, at most [`IN_FLIGHT`] at a time.
async fn resolve_all(lookup: &Lookup, hosts: &[String]) -> Vec<(String, Answer)> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut out = Vec::with_capacity(hosts.len());
    let mut collect = |r: Result<(String, Answer), tokio::task::JoinError>| match r {
        Ok(pair) => out.push(pair),
        Err(e) => log::warn!("a DNS resolution task ended: {e}"),
    };
    for host in hosts {
        if tasks.len() >= IN_FLIGHT {
            if let Some(r) = tasks.join_next().await {
                collect(r);
            }
        }
        let lookup = lookup.clone();
        let host = host.clone();
        tasks.spawn(async move {
            let answer = lookup.resolve(&host).await;
            (host, answer)
        });
    }
    while let Some(r) = tasks.join_next().await {
        collect(r);
    }
    out
}

fn failed_all(hosts: &[String], reason: &str) -> Vec<(String, Answer)> {
    hosts
        .iter()
        .map(|h| {
            (
                h.clone(),
                Answer::Failed {
                    reason: reason.to_owned(),
                },
            )
        })
        .collect()
}

/// Resolves `hosts` on a thread and runtime of their own, for callers that
/// are not async (or not on a runtime that may wait).
fn resolve_blocking(settings: &DnsSettings, hosts: &[String]) -> Vec<(String, Answer)> {
    let names = hosts;
    if names.is_empty() {
        return Vec::new();
    }
    let work = || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => return failed_all(names, &format!("cannot start a runtime: {e}")),
        };
        runtime.block_on(async {
            match Lookup::new(settings) {
                Ok(lookup) => resolve_all(&lookup, names).await,
                Err(reason) => failed_all(names, &reason),
            }
        })
    };
    std::thread::scope(|s| {
        s.spawn(work)
            .join()
            .unwrap_or_else(|_| failed_all(names, "the resolving thread panicked"))
    })
}

#[cfg(unix)]
async fn recv_opt(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}
