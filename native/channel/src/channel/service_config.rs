//! A default service config's load balancing, for targets without xDS
//! (`ChannelBuilder::default_service_config`): gRPC's
//! `loadBalancingConfig` list (the first policy the registry knows), or
//! the deprecated `loadBalancingPolicy` name; `pick_first` when neither
//! is given, as in gRPC. The policy runs over the resolved addresses,
//! each an endpoint.

use crate::lb::wrr_locality::EndpointPolicy;
use crate::xds::resource::cluster::{parse_load_balancing_config, LbPolicy};
use crate::xds::resource::ValidationOptions;

/// The endpoint policy `json` selects; an error names the field and the
/// value.
pub(crate) fn endpoint_policy(
    json: Option<&str>,
    options: &ValidationOptions,
) -> Result<EndpointPolicy, String> {
    let pick_first = EndpointPolicy::PickFirst { shuffle: false };
    let Some(json) = json else {
        return Ok(pick_first);
    };
    let config: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("is not JSON: {e}"))?;
    let Some(config) = config.as_object() else {
        return Err(format!("{config} is not a JSON object"));
    };
    if let Some(list) = config.get("loadBalancingConfig").filter(|v| !v.is_null()) {
        let policy = parse_load_balancing_config(list, options).map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })?;
        return from_policy(policy);
    }
    match config.get("loadBalancingPolicy") {
        None | Some(serde_json::Value::Null) => Ok(pick_first),
        // C-core compares the deprecated field's name case-insensitively.
        Some(serde_json::Value::String(name)) => match name.to_ascii_lowercase().as_str() {
            "pick_first" => Ok(pick_first),
            "round_robin" => Ok(EndpointPolicy::RoundRobin),
            _ => Err(format!(
                "loadBalancingPolicy: {name:?} is not a policy tether knows by this field \
                 (pick_first, round_robin; others through loadBalancingConfig)"
            )),
        },
        Some(other) => Err(format!("loadBalancingPolicy: {other} is not a string")),
    }
}

/// The policies that run over a flat list of addresses; those that need
/// xDS (a ring's request hash, weighted localities) are refused.
fn from_policy(policy: LbPolicy) -> Result<EndpointPolicy, String> {
    Ok(match policy {
        LbPolicy::RoundRobin => EndpointPolicy::RoundRobin,
        LbPolicy::PickFirst { shuffle } => EndpointPolicy::PickFirst { shuffle },
        LbPolicy::LeastRequest { choice_count } => EndpointPolicy::LeastRequest { choice_count },
        LbPolicy::WeightedRoundRobin(s) => EndpointPolicy::WeightedRoundRobin(s),
        LbPolicy::Custom(p) => EndpointPolicy::Custom(p),
        LbPolicy::RingHash { .. } | LbPolicy::Maglev { .. } => {
            return Err(
                "loadBalancingConfig: ring_hash_experimental needs a request hash, which only \
                 an xDS route's hash policy gives (use an xds:/// target)"
                    .to_owned(),
            )
        }
        LbPolicy::WrrLocality(_) => {
            return Err(
                "loadBalancingConfig: xds_wrr_locality_experimental needs xDS localities \
                 (use an xds:/// target)"
                    .to_owned(),
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<EndpointPolicy, String> {
        endpoint_policy(Some(json), &ValidationOptions::default())
    }

    #[test]
    fn policies_by_config_list_or_name_pick_first_by_default() {
        let pf = EndpointPolicy::PickFirst { shuffle: false };
        assert_eq!(
            endpoint_policy(None, &ValidationOptions::default()),
            Ok(pf.clone())
        );
        assert_eq!(parse("{}"), Ok(pf.clone()));
        assert_eq!(
            parse(r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#),
            Ok(EndpointPolicy::RoundRobin)
        );
        assert_eq!(
            parse(
                r#"{"loadBalancingConfig": [{"unknown": {}}, {"pick_first": {"shuffleAddressList": true}}]}"#
            ),
            Ok(EndpointPolicy::PickFirst { shuffle: true })
        );
        assert_eq!(
            parse(
                r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 3}}]}"#
            ),
            Ok(EndpointPolicy::LeastRequest { choice_count: 3 })
        );
        assert_eq!(
            parse(r#"{"loadBalancingPolicy": "ROUND_ROBIN"}"#),
            Ok(EndpointPolicy::RoundRobin)
        );
        // The list wins over the deprecated name, as in gRPC.
        assert_eq!(
            parse(
                r#"{"loadBalancingPolicy": "round_robin", "loadBalancingConfig": [{"pick_first": {}}]}"#
            ),
            Ok(pf)
        );
    }

    #[test]
    fn errors_name_the_field_and_value() {
        for (json, want) in [
            ("{", "is not JSON"),
            ("[]", "[] is not a JSON object"),
            (
                r#"{"loadBalancingConfig": {}}"#,
                "loadBalancingConfig: {} is not an array",
            ),
            (
                r#"{"loadBalancingConfig": [{"nope": {}}]}"#,
                "no supported load balancing policy in the list (tried: nope)",
            ),
            (
                r#"{"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": "yes"}}]}"#,
                "loadBalancingConfig[0].pick_first.shuffleAddressList",
            ),
            (
                r#"{"loadBalancingConfig": [{"ring_hash_experimental": {}}]}"#,
                "needs a request hash",
            ),
            (
                r#"{"loadBalancingPolicy": "grpclb"}"#,
                "loadBalancingPolicy: \"grpclb\"",
            ),
            (
                r#"{"loadBalancingPolicy": 3}"#,
                "loadBalancingPolicy: 3 is not a string",
            ),
        ] {
            let e = parse(json).unwrap_err();
            assert!(e.contains(want), "{json}: {e}");
        }
    }
}
