//! The keys of signed and sealed session cookies: read from each `Session`
//! route's `session.keysFile` (one base64 secret a line, the first signs or
//! seals, all verify or open; blank lines and `#` comments skipped), handed
//! to the plugin in its configuration, never logged. A change of a key file
//! is a reload, so keys rotate without a restart.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use tether_core::cookie::KeyRing;

use crate::model::{Config, ModelError};

/// The base64 secrets of one key file, in its order. Debug shows their
/// number only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SessionKeys(Vec<String>);

impl SessionKeys {
    /// The secrets, the signing (sealing) one first.
    pub fn secrets(&self) -> &[String] {
        &self.0
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKeys({} keys, not shown)", self.0.len())
    }
}

/// The text of each key file `config` names (relative paths against
/// `base`, the configuration file's directory), `None` where it cannot be
/// read: what a poll compares to tell a rotation.
pub fn snapshot(config: &Config, base: &Path) -> BTreeMap<PathBuf, Option<String>> {
    key_files(config)
        .map(|(_, file)| {
            let path = base.join(file);
            let text = std::fs::read_to_string(&path).ok();
            (path, text)
        })
        .collect()
}

/// Whether every file of `snapshot` still holds what it held.
pub fn unchanged(snapshot: &BTreeMap<PathBuf, Option<String>>) -> bool {
    snapshot
        .iter()
        .all(|(path, text)| std::fs::read_to_string(path).ok() == *text)
}

/// Reads every `session.keysFile` of `config` into its route's
/// `session.keys`. An error names the field, the file, the line and what is
/// wrong with it, never a secret; a format `sealed` route's keys must seal.
pub fn load(config: &mut Config, base: &Path) -> Result<(), ModelError> {
    for (vi, vh) in config.virtualhosts.iter_mut().enumerate() {
        for (ri, route) in vh.routes.iter_mut().enumerate() {
            let Some(session) = route.load_balancer_policy.session.as_mut() else {
                continue;
            };
            let Some(file) = session.keys_file.clone() else {
                continue;
            };
            let field =
                format!("virtualhosts[{vi}].routes[{ri}].loadBalancerPolicy.session.keysFile");
            let path = base.join(&file);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| ModelError::invalid(&field, &file, format!("cannot be read: {e}")))?;
            let ring = KeyRing::from_key_file(&text)
                .map_err(|e| ModelError::invalid(&field, &file, e.to_string()))?;
            let sealed = session.format.is_some_and(|f| f.0.is_sealed());
            if sealed {
                ring.check_sealing().map_err(|e| {
                    // `keys[1]` is the file's second key, not its line.
                    ModelError::invalid(&field, &file, format!("{e} (counting keys, not lines)"))
                })?;
            }
            session.keys = SessionKeys(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned)
                    .collect(),
            );
        }
    }
    Ok(())
}

fn key_files(config: &Config) -> impl Iterator<Item = (&str, &str)> {
    config.virtualhosts.iter().flat_map(|vh| {
        vh.routes.iter().filter_map(|r| {
            let s = r.load_balancer_policy.session.as_ref()?;
            Some((vh.name.as_str(), s.keys_file.as_deref()?))
        })
    })
}
