//! A tonic client moved to `tether::Channel`: one type and one constructor
//! changed, the rest of the program as it was. The tonic lines it replaced
//! are in the comments marked `tonic:`.
//!
//! ```sh
//! cargo run -p tether --example tonic_migration -- http://localhost:50051
//! # any gRPC target works too: dns:///echo.example:50051, ipv4:127.0.0.1:50051,...
//! cargo run -p tether --example tonic_migration -- dns:///echo.example:50051 '{"loadBalancingConfig": [{"round_robin": {}}]}'
//! ```

use std::time::Duration;

// tonic: use tonic::transport::Channel;
use tether::Channel;
use tether_proto::demo::v1::echo_client::EchoClient;
use tether_proto::demo::v1::EchoRequest;

async fn connect(
    target: &str,
    service_config: Option<&str>,
) -> Result<Channel, Box<dyn std::error::Error>> {
    // tonic:
    // let channel = tonic::transport::Endpoint::from_shared(target.to_owned())?
    //     .connect_timeout(Duration::from_secs(5))
    //     .timeout(Duration::from_secs(10))
    //     .tcp_nodelay(true)
    //     .user_agent("echo-example/1.0")?
    //     .connect()
    //     .await?;
    let mut builder = Channel::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .user_agent("echo-example/1.0");
    if let Some(json) = service_config {
        builder = builder.default_service_config(json);
    }
    Ok(builder.connect(target)?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first() else {
        return Err("usage: tonic_migration TARGET [SERVICE_CONFIG_JSON]".into());
    };
    let channel = connect(target, args.get(1).map(String::as_str)).await?;
    // Unchanged from here: the generated client takes either channel.
    let mut client = EchoClient::new(channel);
    for i in 0..4 {
        let reply = client
            .echo(EchoRequest {
                message: format!("call {i}"),
            })
            .await?
            .into_inner();
        println!(
            "call {i}: answered by {} at {}",
            reply.backend, reply.address
        );
    }
    Ok(())
}
