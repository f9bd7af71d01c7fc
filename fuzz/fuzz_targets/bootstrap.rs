//! Any text as an xDS bootstrap, and as an A97 token file: parsing never
//! panics, and a bootstrap accepted names a server with usable credentials.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tether::xds::bootstrap::ChannelCreds;
use tether::xds::Bootstrap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(b) = Bootstrap::from_json(text) {
        let server = b.server().expect("an accepted bootstrap has a server");
        let _ = server.address();
        let _ = server.endpoint_uri();
        assert!(matches!(
            server.channel_creds,
            ChannelCreds::Insecure | ChannelCreds::Tls(_)
        ));
        let _ = tether::xds::call_creds::from_bootstrap(&server.call_creds, "xds_servers[0]");
    }
    let _ = tether::xds::call_creds::jwt_exp(text.trim());
});
