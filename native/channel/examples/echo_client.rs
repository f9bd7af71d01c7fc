//! A tonic client on `tether::Channel`: the generated `EchoClient` takes the
//! channel unchanged.
//!
//! ```sh
//! # Through a control plane (the bootstrap names it, as for gRPC C-core):
//! GRPC_XDS_BOOTSTRAP=bootstrap.json cargo run -p tether --example echo_client -- xds:///echo.example
//! # Without one: round robin over fixed endpoints.
//! cargo run -p tether --example echo_client -- 127.0.0.1:50051 127.0.0.1:50052
//! ```

use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::Channel;
use tether_proto::demo::v1::echo_client::EchoClient;
use tether_proto::demo::v1::EchoRequest;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let channel = match args.first() {
        Some(target) if target.starts_with("xds:") => Channel::from_target(target).await?,
        Some(_) => {
            let endpoints = args
                .iter()
                .map(|a| Ok(StaticEndpoint::new(a.parse()?)))
                .collect::<Result<Vec<_>, std::net::AddrParseError>>()?;
            Channel::from_static(
                StaticConfig::new("echo", endpoints).with_policy(EndpointPolicy::RoundRobin),
            )?
        }
        None => return Err("usage: echo_client xds:///NAME | ADDR [ADDR...]".into()),
    };
    let mut client = EchoClient::new(channel.clone());
    for i in 0..6 {
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
    if let Some(stats) = channel.stats().await {
        println!("{}", serde_json::to_string_pretty(&stats)?);
    }
    Ok(())
}
