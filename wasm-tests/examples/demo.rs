//! tether's demo: a real Envoy 1.40 with the tether plugin on 127.0.0.1 in
//! front of three backends that say who they are, and a second Envoy with
//! Envoy's own stateful_session filter. It sends requests a browser or a gRPC
//! client would send and prints what happened: the cookie sent, the backend
//! that answered and the `Set-Cookie` that came back, decoded.
//!
//! Run it with `scripts/demo.sh` (installs Envoy if needed and builds the
//! plugin first), or `cargo run -p tether-wasm-tests --example demo`.

use std::net::SocketAddr;
use tether_core::cookie::Format;
use tether_testkit::free_port;
use tether_wasm_tests::scenario::{
    backend, config_file, grpc_value, legacy_value, minted, now, plugin_path, start_envoy,
    Backends, Minted, Stage, OVERRIDE_HEADER,
};

/// One line of the table.
struct Row {
    request: String,
    sent: String,
    answered: String,
    received: String,
}

fn describe(m: &Minted, backends: &Backends) -> String {
    let c = &m.decoded.cookie;
    let mut s = format!(
        "{}: {}",
        m.decoded.format,
        backends.name_at(c.addresses.primary())
    );
    if let Some(cluster) = &c.cluster {
        s.push_str(&format!(", cluster {cluster}"));
    }
    if let Some(e) = c.expires {
        s.push_str(&format!(", {}s left", e.saturating_sub(now())));
    }
    s
}

fn received(r: &tether_testkit::client::Response, backends: &Backends) -> String {
    match minted(r) {
        Some(m) => describe(&m, backends),
        None => "-".into(),
    }
}

fn answered(r: &tether_testkit::client::Response) -> String {
    match backend(r) {
        "" => format!("{} from Envoy", r.status),
        b => format!("{} {b}", r.status),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // Fail early, with the command that builds it, if the plugin is missing.
    let _ = plugin_path();
    let stage = Stage::config_file("plugin-override-host.yaml", None).await;
    let bs = &stage.backends;
    // Envoy's own filter in front of the same backends, to mint a stock cookie.
    let native_port = free_port();
    let native = start_envoy(&config_file("native-cookie.yaml", native_port, &bs.addrs())).await;
    let native_addr = SocketAddr::from(([127, 0, 0, 1], native_port));

    let mut rows = Vec::new();
    let mut push = |request: &str, sent: String, r: &tether_testkit::client::Response| {
        rows.push(Row {
            request: request.into(),
            sent,
            answered: answered(r),
            received: received(r, bs),
        });
    };

    // 1. A new client: load balanced, and pinned by the response.
    let r = stage.get("/", &[]).await;
    let first = minted(&r).expect("a session cookie");
    push("first request", "-".into(), &r);
    let pinned = backend(&r).to_string();

    // 2. The browser sends it back: same backend, nothing new to set.
    for i in 1..=3 {
        let r = stage.get_with_cookie("/cart", &first.value).await;
        push(&format!("replay #{i}"), describe(&first, bs), &r);
    }

    // 3. A cookie set by Envoy's own stateful_session filter.
    let r = tether_testkit::client::get(native_addr, "/", &[])
        .await
        .expect("native Envoy");
    let stock = minted(&r).expect("Envoy's filter sets a cookie");
    push("to the Envoy with Envoy's own filter", "-".into(), &r);
    let r = stage.get_with_cookie("/", &stock.value).await;
    push("Envoy-minted cookie", describe(&stock, bs), &r);

    // 4. gRPC C-core's cookie format, and the legacy plain ip:port.
    let grpc = grpc_value(stage.addr_of("backend-3"), "app");
    let r = stage.get_with_cookie("/", &grpc).await;
    push(
        "gRPC C-core cookie",
        "grpc: backend-3, cluster app".into(),
        &r,
    );
    let r = stage
        .get_with_cookie("/", &legacy_value(stage.addr_of("backend-2")))
        .await;
    push("legacy cookie", "legacy: backend-2".into(), &r);

    // 5. A client trying to pick its backend by sending the override header.
    let b1 = stage.addr_of("backend-1").to_string();
    for i in 1..=3 {
        let r = stage.get("/", &[(OVERRIDE_HEADER, &b1)]).await;
        push(
            &format!("client picks backend-1 #{i}"),
            format!("- ({OVERRIDE_HEADER}: {b1})"),
            &r,
        );
    }

    // 6. The session's backend goes away: fall back, re-pin, never pin to it.
    bs.named(&pinned).stop().await;
    let r = stage.get_with_cookie("/", &first.value).await;
    push(
        &format!("{pinned} stopped, replay"),
        describe(&first, bs),
        &r,
    );
    if let Some(moved) = minted(&r) {
        let r = stage.get_with_cookie("/", &moved.value).await;
        push("replay the new cookie", describe(&moved, bs), &r);
    }
    drop(native);

    print_table(&rows);
    println!();
    println!("Set-Cookie of row 1 as sent: {}", first.header);
    println!(
        "Envoy 1.40 with the tether plugin ({}) on {}; cookie format {}.",
        plugin_path(),
        stage.listen,
        Format::Envoy
    );
    println!(
        "Backends: {}",
        bs.0.iter()
            .map(|b| format!("{} {}", b.name(), b.addr()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn print_table(rows: &[Row]) {
    let head = [
        "#",
        "request",
        "cookie sent",
        "answered by",
        "Set-Cookie received",
    ];
    let cells: Vec<[String; 5]> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            [
                (i + 1).to_string(),
                r.request.clone(),
                r.sent.clone(),
                r.answered.clone(),
                r.received.clone(),
            ]
        })
        .collect();
    let mut width = head.map(str::len);
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: [&str; 5]| {
        let parts: Vec<String> = row
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join(" | ").trim_end());
    };
    line(head);
    println!("{}", width.map(|w| "-".repeat(w)).join("-+-"));
    for row in &cells {
        line([&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
}
