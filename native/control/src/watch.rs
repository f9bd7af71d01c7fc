//! Reloading the configuration file: on every change of its content (checked
//! every poll interval) and on SIGHUP. A file that does not parse or validate
//! is rejected with an error naming the field and, where the field is
//! written in the file, its line; the last good snapshot keeps being served.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::model::{Config, ModelError, Overrides};
use super::server::ControlPlane;
use super::translate::translate;

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
    let config = Config::parse_with(&text, overrides).map_err(|error| LoadError::Model {
        path: path.to_owned(),
        error,
    })?;
    for note in config.session_notes() {
        log::info!("{}: {note}", path.display());
    }
    Ok((config, text))
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

/// Watches one file and publishes its translation to a control plane.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    plane: ControlPlane,
    last_text: Option<String>,
    overrides: Overrides,
}

impl Reloader {
    /// Loads `path` (which must be valid) and returns the control plane
    /// serving it with the reloader that keeps it current.
    pub fn start(path: &Path) -> Result<(ControlPlane, Reloader), LoadError> {
        Reloader::start_with(path, Overrides::default())
    }

    /// As [`Reloader::start`], with `overrides` (command-line settings)
    /// applied to every version of the file.
    pub fn start_with(
        path: &Path,
        overrides: Overrides,
    ) -> Result<(ControlPlane, Reloader), LoadError> {
        let (config, text) = load_with(path, &overrides)?;
        let plane = ControlPlane::new(translate(&config));
        Ok((
            plane.clone(),
            Reloader {
                path: path.to_owned(),
                plane,
                last_text: Some(text),
                overrides,
            },
        ))
    }

    /// Wraps an existing control plane; the first [`Reloader::reload`] loads the file.
    pub fn new(path: &Path, plane: ControlPlane) -> Self {
        Reloader {
            path: path.to_owned(),
            plane,
            last_text: None,
            overrides: Overrides::default(),
        }
    }

    /// Re-reads the file; publishes it when its content changed and is valid.
    pub fn reload(&mut self) -> Reload {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => {
                return Reload::Rejected(LoadError::Io {
                    path: self.path.clone(),
                    message: e.to_string(),
                })
            }
        };
        if self.last_text.as_deref() == Some(text.as_str()) {
            return Reload::Unchanged;
        }
        // Remember bad content too, so it is reported once, not every poll.
        self.last_text = Some(text.clone());
        match Config::parse_with(&text, &self.overrides) {
            Ok(config) => Reload::Published(self.plane.publish(translate(&config))),
            Err(error) => Reload::Rejected(LoadError::Model {
                path: self.path.clone(),
                error,
            }),
        }
    }

    /// Polls the file every `interval` (the first poll one interval from
    /// now: the file was just loaded) and reloads on SIGHUP, forever,
    /// reporting each outcome to `report`. The SIGHUP handler is installed
    /// before this returns, so a signal sent once it has returned is never
    /// lost (nor, by default, fatal). Must be called within a Tokio runtime.
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
                #[cfg(unix)]
                {
                    let forced = tokio::select! {
                        _ = tick.tick() => false,
                        Some(()) = recv_opt(&mut hup) => true,
                    };
                    if forced {
                        // A signal re-reads even unchanged content.
                        self.last_text = None;
                    }
                }
                #[cfg(not(unix))]
                tick.tick().await;
                let outcome = self.reload();
                if outcome != Reload::Unchanged {
                    report(&outcome);
                }
            }
        }
    }
}

#[cfg(unix)]
async fn recv_opt(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}
