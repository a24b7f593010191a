//! The JSON gateway's readers of untrusted bytes (`proxy/src/gateway/json.rs`): a client's JSON request body for any
//! gateway path, and etcd's answer bytes written back as JSON. Neither may panic; a request the gateway accepts must
//! encode as the request etcd expects, and an answer it writes must be a JSON object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxy::fuzzing::{GATEWAY_ROUTES, gateway_request_decodes, gateway_response_is_object};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (path, grpc) = GATEWAY_ROUTES[usize::from(pick) % GATEWAY_ROUTES.len()];
    if let Some(decodes) = gateway_request_decodes(grpc, rest) {
        assert!(decodes, "{path}: an accepted body encoded as something else");
    }
    if let Some(object) = gateway_response_is_object(grpc, rest) {
        assert!(object, "{path}: an answer written as JSON that is not an object");
    }
});
