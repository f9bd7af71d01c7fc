//! `tether xds dump --csds ADDR`: asks a running process's Client Status
//! Discovery Service (gRFC A40: tether's `tether::csds::service()`,
//! grpcio's `grpc_csds`, grpc-go's admin server) what its XdsClients hold,
//! and prints it as one JSON document: per client its node, and per
//! resource its type, name, status, version, when it was last updated, the
//! last NACKed update, and the resource as tether validates it.

use envoy_types::pb::envoy::admin::v3::ClientResourceStatus;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ClientStatusRequest};
use envoy_types::pb::google::protobuf::Timestamp;
use serde_json::{json, Map, Value};
use tether_xds::resource::{self, ResourceKind};

/// The status's name as `tether xds dump` writes statuses.
fn status_name(status: i32) -> &'static str {
    match ClientResourceStatus::try_from(status) {
        Ok(ClientResourceStatus::Requested) => "requested",
        Ok(ClientResourceStatus::DoesNotExist) => "does_not_exist",
        Ok(ClientResourceStatus::Acked) => "acked",
        Ok(ClientResourceStatus::Nacked) => "nacked",
        Ok(ClientResourceStatus::ReceivedError) => "received_error",
        Ok(ClientResourceStatus::Timeout) => "timeout",
        _ => "unknown",
    }
}

/// RFC 3339 in UTC, to the millisecond.
fn time(t: &Timestamp) -> Value {
    let secs = t.seconds;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    json!(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        t.nanos / 1_000_000
    ))
}

fn resource_entry(c: &GenericXdsConfig) -> Value {
    let kind = ResourceKind::from_type_url(&c.type_url);
    let mut m = Map::new();
    m.insert(
        "type".into(),
        json!(kind.map_or_else(|| c.type_url.clone(), |k| k.short_name().to_owned())),
    );
    m.insert("name".into(), json!(c.name));
    m.insert("status".into(), json!(status_name(c.client_status)));
    m.insert(
        "version".into(),
        if c.version_info.is_empty() {
            Value::Null
        } else {
            json!(c.version_info)
        },
    );
    m.insert(
        "last_updated".into(),
        c.last_updated.as_ref().map_or(Value::Null, time),
    );
    if let Some(e) = &c.error_state {
        m.insert(
            "error".into(),
            json!({
                "rejected_version": e.version_info,
                "details": e.details,
                "at": e.last_update_attempt.as_ref().map_or(Value::Null, time),
            }),
        );
    }
    let validated = match (kind, &c.xds_config) {
        (Some(kind), Some(any)) => match resource::decode(kind, any).result {
            Ok(r) => super::xds::resource_json(&r),
            Err(e) => json!({ "invalid": e.to_string() }),
        },
        (None, Some(any)) => json!({ "type_url": any.type_url }),
        (_, None) => Value::Null,
    };
    m.insert("resource".into(), validated);
    Value::Object(m)
}

fn client_json(c: &ClientConfig) -> Value {
    let resources: Vec<Value> = c.generic_xds_configs.iter().map(resource_entry).collect();
    json!({
        "node_id": c.node.as_ref().map(|n| n.id.clone()),
        "client_scope": c.client_scope,
        "resources": resources,
    })
}

/// Fetches the client status from `addr` (`HOST:PORT`, or a URI) and
/// returns the document, or why there is none.
pub async fn fetch(addr: &str) -> Result<Value, String> {
    let uri = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| format!("--csds {addr:?} is not an address: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(10))
        .timeout(std::time::Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot reach the CSDS service at {uri}: {e}"))?;
    let response = ClientStatusDiscoveryServiceClient::new(channel)
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .map_err(|s| format!("CSDS at {uri}: {:?}: {}", s.code(), s.message()))?
        .into_inner();
    let clients: Vec<Value> = response.config.iter().map(client_json).collect();
    Ok(json!({ "csds": addr, "clients": clients }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_rfc_3339() {
        let t = |seconds, nanos| time(&Timestamp { seconds, nanos });
        assert_eq!(t(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400, 5_000_000), "2000-02-29T00:00:00.005Z");
        assert_eq!(t(1_795_698_000, 0), "2026-11-26T13:00:00.000Z");
    }
}
