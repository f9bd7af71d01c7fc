//! Errors an xDS server reports per resource (`DiscoveryResponse.resource_errors`,
//! xRFC TP3), read as gRPC C-core reads them with gRFC A88 on: the resource
//! turns `RECEIVED_ERROR`, its cached copy is kept (or dropped with
//! `fail_on_data_errors` for NOT_FOUND and PERMISSION_DENIED), the response
//! is ACKed, a malformed entry NACKs it, and without A88 the field is not
//! read at all. A real ADS server on 127.0.0.1.

mod xds_support;

use std::time::Duration;

use tether_xds::client::{ClientOptions, ResourceStatus};
use tether_xds::{ResourceKind, ResourceState, Watcher, XdsClient, XdsError};
use xds_support::{make, Fixture, Mode, Received, CDS};

const NOT_FOUND: i32 = 5;
const PERMISSION_DENIED: i32 = 7;
const UNAVAILABLE: i32 = 14;

fn client(f: &Fixture, node: &str, features: &str, a88: bool) -> XdsClient {
    let bootstrap = tether_xds::Bootstrap::from_json(&format!(
        r#"{{"xds_servers":[{{"server_uri":"{}","channel_creds":[{{"type":"insecure"}}],"server_features":[{features}]}}],"node":{{"id":"{node}"}}}}"#,
        f.addr
    ))
    .unwrap();
    let mut options = ClientOptions::default();
    options.data_error_handling = a88;
    XdsClient::start_with(bootstrap, options).unwrap()
}

async fn state_when(
    what: &str,
    w: &mut Watcher,
    pred: impl FnMut(&ResourceState) -> bool,
) -> ResourceState {
    tokio::time::timeout(Duration::from_secs(10), w.wait_for(pred))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap()
}

/// The client's answer to the response carrying `version`: waits for it.
async fn answer_to(f: &Fixture, version: &str, skip: usize) -> Received {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let answers: Vec<Received> = f
                .requests()
                .into_iter()
                .filter(|r| r.request.type_url == CDS && !r.request.response_nonce.is_empty())
                .collect();
            if let Some(r) = answers
                .into_iter()
                .skip(skip)
                .find(|r| r.request.version_info == version || r.request.error_detail.is_some())
            {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no answer to version {version}"))
}

fn received_error(s: &ResourceState) -> Option<(tonic::Code, String)> {
    match &s.status {
        ResourceStatus::ReceivedError { code, message, .. } => Some((*code, message.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn an_error_for_an_uncached_resource_is_its_state_and_the_response_is_acked() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_errors(CDS, &[("c1", PERMISSION_DENIED, "not for you")]);
    let version = f.version().to_string();
    let c = client(&f, "tp3-uncached", "", true);
    let mut w = c.watch(ResourceKind::Cluster, "c1");
    let s = state_when("the error", &mut w, |s| s.error.is_some()).await;
    assert_eq!(
        s.status,
        ResourceStatus::ReceivedError {
            version: version.clone(),
            code: tonic::Code::PermissionDenied,
            message: "not for you".into(),
        }
    );
    assert!(s.resource.is_none());
    assert!(!s.is_ambient_error());
    let err = s.error.unwrap();
    assert!(matches!(err, XdsError::ReceivedError { .. }));
    assert_eq!(
        err.to_string(),
        "Cluster resource \"c1\": the xDS server reported PERMISSION_DENIED: not for you (node ID:tp3-uncached)"
    );
    let rejected = s.rejected.unwrap();
    assert_eq!(
        (rejected.version.as_str(), rejected.details.as_str()),
        (version.as_str(), "not for you")
    );
    // An error is no reason to NACK: the response is ACKed with its version.
    let ack = answer_to(&f, &version, 0).await;
    assert!(ack.request.error_detail.is_none(), "{:?}", ack.request);
    // The resource arriving later clears it.
    f.set_errors(CDS, &[]);
    f.set_resources(CDS, vec![tether_xds::resource::pack(&make::cluster("c1"))]);
    f.push(CDS);
    let s = state_when("the resource", &mut w, |s| s.resource.is_some()).await;
    assert!(matches!(s.status, ResourceStatus::Acked { .. }));
    assert!(s.error.is_none() && s.rejected.is_none());
}

#[tokio::test]
async fn a_cached_resource_is_kept_beside_the_error_unless_fail_on_data_errors_and_gone() {
    // (server features, code, whether the cached cluster survives)
    let cases = [
        ("", NOT_FOUND, true),
        ("", PERMISSION_DENIED, true),
        (r#""fail_on_data_errors""#, UNAVAILABLE, true),
        (r#""fail_on_data_errors""#, NOT_FOUND, false),
        (r#""fail_on_data_errors""#, PERMISSION_DENIED, false),
    ];
    for (i, (features, code, kept)) in cases.into_iter().enumerate() {
        let f = Fixture::start(Mode::Serve).await;
        f.set_resources(CDS, vec![tether_xds::resource::pack(&make::cluster("c1"))]);
        let c = client(&f, &format!("tp3-cached-{i}"), features, true);
        let mut w = c.watch(ResourceKind::Cluster, "c1");
        state_when("the cluster", &mut w, |s| s.resource.is_some()).await;
        // The next state-of-the-world response leaves c1 out and reports an
        // error for it instead: an error, not a deletion.
        f.set_resources(CDS, vec![]);
        f.set_errors(CDS, &[("c1", code, "withdrawn")]);
        f.push(CDS);
        let s = state_when("the error", &mut w, |s| received_error(s).is_some()).await;
        let label = format!("case {i}: features [{features}] code {code}");
        assert_eq!(
            received_error(&s),
            Some((tonic::Code::from_i32(code), "withdrawn".into())),
            "{label}"
        );
        assert_eq!(s.resource.is_some(), kept, "{label}");
        assert_eq!(s.is_ambient_error(), kept, "{label}");
        assert_eq!(s.resource_version.is_some(), kept, "{label}");
    }
}

#[tokio::test]
async fn malformed_entries_nack_the_response_and_without_a88_the_field_is_not_read() {
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(CDS, vec![tether_xds::resource::pack(&make::cluster("c1"))]);
    f.set_errors(
        CDS,
        &[("", UNAVAILABLE, "no name"), ("c1", 0, "ok is no error")],
    );
    let version = f.version().to_string();
    let c = client(&f, "tp3-malformed", "", true);
    let mut w = c.watch(ResourceKind::Cluster, "c1");
    let s = state_when("the cluster", &mut w, |s| s.resource.is_some()).await;
    assert!(matches!(s.status, ResourceStatus::Acked { .. }), "{s:?}");
    let nack = answer_to(&f, &version, 0).await;
    let detail = nack.request.error_detail.expect("a NACK");
    assert!(
        detail.message.contains("resource_errors[0].resource_name")
            && detail.message.contains("resource_errors[1].error_detail"),
        "{}",
        detail.message
    );
    // c1 was valid in it, so the NACK carries the response's version (C-core).
    assert_eq!(nack.request.version_info, version);

    // Without A88 the errors are not read: the cluster is simply deleted
    // from the state-of-the-world response, and the response is ACKed.
    let f = Fixture::start(Mode::Serve).await;
    f.set_resources(CDS, vec![tether_xds::resource::pack(&make::cluster("c1"))]);
    let c = client(&f, "tp3-off", "", false);
    let mut w = c.watch(ResourceKind::Cluster, "c1");
    state_when("the cluster", &mut w, |s| s.resource.is_some()).await;
    f.set_resources(CDS, vec![]);
    f.set_errors(
        CDS,
        &[("c1", PERMISSION_DENIED, "not for you"), ("", 0, "")],
    );
    let version = f.version().to_string();
    f.push(CDS);
    let s = state_when("the deletion", &mut w, |s| {
        s.status == ResourceStatus::DoesNotExist
    })
    .await;
    assert!(s.resource.is_none());
    let ack = answer_to(&f, &version, 1).await;
    assert!(ack.request.error_detail.is_none(), "{:?}", ack.request);
}
