//! A real Prometheus (Debian's `prometheus`) for the metrics tests: started
//! on a free 127.0.0.1 port, scraping its targets every second, asked with
//! PromQL over its HTTP API until it has scraped what a test did. Killed
//! and its data removed on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::{client, free_port};

/// How long [`Prometheus::until`] waits for a query's answer.
pub const WAIT: Duration = Duration::from_secs(30);

/// A Prometheus process scraping some targets.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// The binary: `PROMETHEUS`, else Debian's.
    fn binary() -> PathBuf {
        let path = std::env::var_os("PROMETHEUS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
        assert!(
            path.exists(),
            "{} not found: install Debian's prometheus (scripts/setup.sh does) or set PROMETHEUS",
            path.display()
        );
        path
    }

    /// Starts one scraping each `(job, target)` every second at `/metrics`.
    pub async fn start(targets: &[(&str, SocketAddr)]) -> Prometheus {
        crate::sweep_stale_temp_dirs();
        let dir = std::env::temp_dir().join(format!(
            "tether-prometheus-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (job, target) in targets {
            config += &format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [\"{target}\"]\n"
            );
        }
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).expect("prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let child = Command::new(Prometheus::binary())
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn prometheus");
        Prometheus { child, addr, dir }
    }

    /// The value of the one series `query` returns, when it returns one.
    pub async fn value(&self, query: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", encode(query));
        let response = client::get(self.addr, &path, &[]).await.ok()?;
        if response.status != 200 {
            return None;
        }
        let json = response.json();
        let result = json["data"]["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Waits until `query` gives `want` (Prometheus has scraped it), within
    /// [`WAIT`]; panics naming the last answer otherwise.
    pub async fn until(&self, query: &str, want: f64) {
        let deadline = Instant::now() + WAIT;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.value(query).await;
            if last == Some(want) {
                return;
            }
            // The next scrape is at most a second away.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{query}: {last:?} after {WAIT:?}, wanted {want}");
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A query string's percent-encoding (PromQL has braces, quotes, spaces).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
