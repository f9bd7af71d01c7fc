//! A custom load-balancing policy (gRFC A52) registered with a channel:
//! `example.weighted_random` (in `policy.rs`) draws a READY endpoint at
//! random in proportion to its weight.
//!
//! ```sh
//! # Three local backends weighted 1, 2 and 3, a static channel over them
//! # running the policy, 600 calls: prints the calls each backend got.
//! cargo run -p tether --example weighted_random
//! # Through a control plane whose clusters select the policy with an
//! # xds.type.v3.TypedStruct of type URL type.googleapis.com/example.weighted_random
//! # (tether-control: `strategy: Custom`, `custom: {policy: example.weighted_random}`):
//! GRPC_XDS_BOOTSTRAP=bootstrap.json cargo run -p tether --example weighted_random -- xds:///echo.example
//! ```

mod policy;

use std::collections::BTreeMap;

use tether::channel::{EndpointPolicy, StaticConfig, StaticEndpoint};
use tether::lb::registry::custom_policy;
use tether::lb::PolicyRegistry;
use tether::Channel;
use tether_testkit::grpc::{EchoClient, EchoRequest, GrpcBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = PolicyRegistry::new().with(policy::Builder)?;
    let mut backends = Vec::new();
    let channel = match std::env::args().nth(1) {
        // xDS: the registry goes to the channel's XdsClient, whose
        // validation then accepts clusters that name the policy.
        Some(target) => Channel::builder()
            .lb_policy_registry(registry)
            .connect(&target)?,
        None => {
            let mut endpoints = Vec::new();
            for weight in 1..=3 {
                let backend = GrpcBackend::start(&format!("weight-{weight}")).await;
                let mut e = StaticEndpoint::new(backend.addr());
                e.weight = weight;
                endpoints.push(e);
                backends.push(backend);
            }
            let builder = registry.get(policy::NAME).expect("registered");
            let policy = custom_policy(builder, serde_json::json!({}))?;
            Channel::from_static(
                StaticConfig::new("weighted-random", endpoints)
                    .with_policy(EndpointPolicy::Custom(policy)),
            )?
        }
    };
    let mut client = EchoClient::new(channel);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..600 {
        let reply = client
            .echo(EchoRequest {
                message: "hello".into(),
            })
            .await?
            .into_inner();
        *counts.entry(reply.backend).or_default() += 1;
    }
    for (backend, calls) in counts {
        println!("{backend}: {calls} calls");
    }
    Ok(())
}
