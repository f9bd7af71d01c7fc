//! `pick_first` on a static channel over real tonic backends on loopback:
//! after its connection closes it waits IDLE for the next call (gRFC A62),
//! then connects again.

use std::time::Duration;

use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::lb::ConnectivityState;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

/// The backend that answered a call, within `within`.
async fn echo(channel: &Channel, within: Duration) -> Result<String, tonic::Status> {
    let mut client = EchoClient::new(channel.clone());
    let call = client.echo(EchoRequest {
        message: "x".into(),
    });
    let reply = tokio::time::timeout(within, call)
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("the call did not end"))??;
    Ok(reply.into_inner().backend)
}

/// Connection attempts of every subchannel of the tree.
async fn attempts(channel: &Channel) -> u64 {
    fn walk(p: &tether::lb::PolicyStats) -> u64 {
        p.endpoints.iter().map(|e| e.connect_attempts).sum::<u64>()
            + p.children.iter().map(walk).sum::<u64>()
    }
    walk(&channel.stats().await.expect("stats").tree)
}

#[tokio::test]
async fn a_closed_connection_waits_idle_for_the_next_call() {
    let first = GrpcBackend::start("first").await;
    let addr = first.addr();
    let channel = Channel::from_static(
        StaticConfig::new("pf-idle", vec![StaticEndpoint::new(addr)])
            .with_policy(EndpointPolicy::PickFirst { shuffle: false }),
    )
    .unwrap();
    assert_eq!(
        echo(&channel, Duration::from_secs(5)).await.unwrap(),
        "first"
    );
    assert_eq!(channel.state(), ConnectivityState::Ready);
    assert_eq!(attempts(&channel).await, 1);

    // The server closes the connection (the backend stops, as if it
    // crashed) and a new one serves the same port at once.
    first.stop().await;
    let second = GrpcBackend::start_on("second", addr).await;
    tokio::time::timeout(
        Duration::from_secs(5),
        channel.wait_for_state(ConnectivityState::Idle),
    )
    .await
    .unwrap_or_else(|_| panic!("not IDLE after the close: {:?}", channel.state()));

    // Nobody calls: nothing connects. A bounded observation window, kept:
    // a reconnect without a call would come from the LB policy (on the
    // IDLE event, or a timer on the LB timer thread, which paused tokio
    // time does not reach), and nothing announces that it did not happen.
    // 1 s is gRPC's initial reconnect backoff; the call below is the
    // positive control: a connection attempt shows in `attempts` at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(channel.state(), ConnectivityState::Idle);
    assert_eq!(attempts(&channel).await, 1, "reconnected without a call");
    assert_eq!(second.hits(), 0);

    // A call connects again and is served.
    assert_eq!(
        echo(&channel, Duration::from_secs(5)).await.unwrap(),
        "second"
    );
    assert_eq!(channel.state(), ConnectivityState::Ready);
    assert_eq!(attempts(&channel).await, 2);
    assert_eq!(second.hits(), 1);
}
