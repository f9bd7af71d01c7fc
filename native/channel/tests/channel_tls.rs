//! TLS and mTLS on the channel's connections, against real tonic backends
//! serving TLS with rustls and certificates each test generates: calls
//! succeed over TLS and present the client identity when one is set; a
//! server that does not chain to the roots, whose name does not match, that
//! wants a client certificate the channel lacks, or that speaks plaintext
//! fails the connection, and the calls fail UNAVAILABLE naming the TLS
//! error, never falling back to plaintext.

#[path = "../../control/tests/control_support/mod.rs"]
mod control_support;

use std::time::Duration;

use control_support::{Control, TempDir};

use tether::channel::{StaticConfig, StaticEndpoint};
use tether::credentials::TlsConfig;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};
use tether_testkit::tls::{fingerprint, server_config, Ca};

fn request() -> tonic::Request<EchoRequest> {
    let mut r = tonic::Request::new(EchoRequest {
        message: "hi".into(),
    });
    r.set_timeout(Duration::from_secs(10));
    r
}

fn channel(backend: &GrpcBackend, tls: Option<TlsConfig>) -> Channel {
    let mut builder = Channel::builder();
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    builder
        .connect_static(StaticConfig::new(
            "tls",
            vec![StaticEndpoint::new(backend.addr())],
        ))
        .unwrap()
}

/// One call: the backend's name and the client certificate it saw.
async fn call(channel: &Channel) -> Result<(String, Option<String>), tonic::Status> {
    let reply = EchoClient::new(channel.clone()).echo(request()).await?;
    let seen = reply
        .metadata()
        .get("x-client-cert")
        .map(|v| v.to_str().unwrap().to_owned());
    Ok((reply.into_inner().backend, seen))
}

#[tokio::test]
async fn tls_to_an_ip_address_and_mtls_with_a_client_identity() {
    let servers = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let server = servers.issue(&["127.0.0.1"]);
    let client = clients.issue(&["spiffe://tether.test/ns/default/sa/client"]);

    // TLS: the server's certificate names 127.0.0.1, the channel's default.
    let a = GrpcBackend::start_tls("a", server_config(&server, None)).await;
    let tls = TlsConfig::from_ca_pem(servers.pem()).unwrap();
    let (backend, seen) = call(&channel(&a, Some(tls.clone()))).await.unwrap();
    assert_eq!((backend.as_str(), seen), ("a", None));

    // mTLS: the server requires a certificate from the client CA.
    let b = GrpcBackend::start_tls("b", server_config(&server, Some(&clients))).await;
    let with_identity = tls
        .clone()
        .with_identity_pem(&client.cert_pem, &client.key_pem)
        .unwrap();
    let (backend, seen) = call(&channel(&b, Some(with_identity))).await.unwrap();
    assert_eq!(backend, "b");
    assert_eq!(seen, Some(fingerprint(&client.cert_der)));

    // Without an identity, the server refuses the handshake (in TLS 1.3
    // its alert comes once the client has finished, during HTTP/2's).
    let status = call(&channel(&b, Some(tls))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("fatal alert: CertificateRequired"),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_server_that_does_not_verify_fails_the_connection_naming_why() {
    let servers = Ca::new("server CA");
    let other = Ca::new("another CA");
    let a = GrpcBackend::start_tls(
        "a",
        server_config(&servers.issue(&["backend.tether.test"]), None),
    )
    .await;

    // Roots the chain does not end in.
    let status = call(&channel(
        &a,
        Some(TlsConfig::from_ca_pem(other.pem()).unwrap()),
    ))
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("UnknownIssuer"), "{status:?}");

    // The right roots, but the certificate names another host than the
    // endpoint's address.
    let tls = TlsConfig::from_ca_pem(servers.pem()).unwrap();
    let status = call(&channel(&a, Some(tls.clone()))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("certificate not valid for name \"127.0.0.1\""),
        "{status:?}"
    );

    // Verified against the name it carries.
    let named = tls.with_server_name("backend.tether.test").unwrap();
    assert_eq!(call(&channel(&a, Some(named))).await.unwrap().0, "a");
}

#[tokio::test]
async fn tls_and_plaintext_never_mix() {
    let servers = Ca::new("server CA");
    let tls_backend =
        GrpcBackend::start_tls("tls", server_config(&servers.issue(&["127.0.0.1"]), None)).await;
    let plain_backend = GrpcBackend::start("plain").await;
    let tls = TlsConfig::from_ca_pem(servers.pem()).unwrap();

    // A TLS channel to a plaintext server: the handshake fails.
    let status = call(&channel(&plain_backend, Some(tls))).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("TLS handshake with"),
        "{status:?}"
    );
    assert_eq!(plain_backend.hits(), 0);

    // A plaintext channel to a TLS server: no HTTP/2 there.
    let status = call(&channel(&tls_backend, None)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(tls_backend.hits(), 0);
}

/// Over xDS (the real tether-control), servers are verified against the
/// target's name, as gRPC verifies against the channel's authority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xds_target_verifies_servers_against_its_name() {
    let servers = Ca::new("server CA");
    let right = GrpcBackend::start_tls(
        "right",
        server_config(&servers.issue(&["tls.tether.test"]), None),
    )
    .await;
    let wrong = GrpcBackend::start_tls(
        "wrong",
        server_config(&servers.issue(&["other.tether.test"]), None),
    )
    .await;
    let yaml = |addr| {
        format!(
            "virtualhosts:\n  - name: tls.tether.test\n    routes:\n      - services: [{{ name: s }}]\n\
             services:\n  - name: s\n    protocol: h2c\n    endpoints:\n      - address: \"{addr}\"\n"
        )
    };
    let dir = TempDir::new("tls");
    for (backend, ok) in [(&right, true), (&wrong, false)] {
        let control = Control::start(&yaml(backend.addr())).await;
        let bootstrap = dir.bootstrap(&control.bootstrap_json("tls"));
        let channel = Channel::builder()
            .bootstrap(tether::xds::Bootstrap::from_file(&bootstrap).unwrap())
            .tls(TlsConfig::from_ca_pem(servers.pem()).unwrap())
            .connect("xds:///tls.tether.test")
            .unwrap();
        let mut client = EchoClient::new(channel);
        // The resources first, then the connection's outcome.
        let result = tether_testkit::wait_until(Duration::from_secs(10), || {
            let mut client = client.clone();
            async move {
                match client.echo(request()).await {
                    Ok(_) => true,
                    Err(s) => s.message().contains("TLS handshake"),
                }
            }
        })
        .await;
        assert!(result, "no outcome within 10 s");
        let outcome = client.echo(request()).await;
        match (ok, outcome) {
            (true, Ok(reply)) => assert_eq!(reply.into_inner().backend, "right"),
            (false, Err(status)) => assert!(
                status
                    .message()
                    .contains("certificate not valid for name \"tls.tether.test\""),
                "{status:?}"
            ),
            (_, other) => panic!("{}: {other:?}", backend.addr()),
        }
    }
}

#[test]
fn configuration_errors_name_what_was_read() {
    let e = TlsConfig::from_ca_pem("not a certificate").unwrap_err();
    assert_eq!(e.to_string(), "CA certificates: no CERTIFICATE block");
    let e = TlsConfig::from_ca_file("/nonexistent/ca.pem").unwrap_err();
    assert!(
        e.to_string().starts_with("reading /nonexistent/ca.pem: "),
        "{e}"
    );

    let ca = Ca::new("CA");
    let issued = ca.issue(&["client"]);
    let tls = TlsConfig::from_ca_pem(ca.pem()).unwrap();
    let e = tls
        .clone()
        .with_identity_pem(&issued.cert_pem, "no key here")
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("client key: no usable PRIVATE KEY block"),
        "{e}"
    );
    let e = tls
        .clone()
        .with_identity_pem("", &issued.key_pem)
        .unwrap_err();
    assert_eq!(e.to_string(), "client certificate: no CERTIFICATE block");
    let e = tls.with_server_name("not a name!").unwrap_err();
    assert_eq!(
        e.to_string(),
        "server name \"not a name!\" is neither a DNS name nor an IP address"
    );
}
