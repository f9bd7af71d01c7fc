//! Any bytes as an xDS resource of each kind: validation never panics, and
//! an accepted route configuration can be matched against calls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether::channel::config_selector::route_matches;
use tether::xds::resource::{decode, Resource, ResourceKind};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the kind (and whether to wrap the resource in a
    // discovery Resource); the rest is the protobuf.
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let kind = ResourceKind::ALL[usize::from(selector) % ResourceKind::ALL.len()];
    let mut any = envoy_types::pb::google::protobuf::Any {
        type_url: kind.type_url().to_owned(),
        value: body.to_vec(),
    };
    if selector & 0x80 != 0 {
        any.type_url = "type.googleapis.com/envoy.service.discovery.v3.Resource".to_owned();
    }
    let decoded = decode(kind, &any);
    if let Ok(Resource::RouteConfiguration(rc)) = decoded.result {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-user", http::HeaderValue::from_static("alice"));
        for host in ["shop.example", "", "*"] {
            if let Some(vh) = rc.virtual_host_for(host) {
                for r in &vh.routes {
                    let _ = route_matches(&r.matcher, "/tether.demo.v1.Echo/Echo", &headers);
                }
            }
        }
    }
});
