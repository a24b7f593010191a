//! gRPC path routing (`rpc/methods.rs`): the path of a request target, as `Rpc::serve` takes it from the URI, to
//! its route, grpc-go's answer for a path etcd does not serve, and the namespace's schemas by path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxy::fuzzing::{Repeat, Route, keyed_method, request_path, route, unknown};
use tonic::Code;

fuzz_target!(|data: &[u8]| {
    if let Some(path) = request_path(data) {
        check(&path);
    }
    check(&String::from_utf8_lossy(data));
});

fn check(path: &str) {
    match route(path) {
        Some(found) => {
            let (service, method) = path
                .strip_prefix('/')
                .and_then(|p| p.split_once('/'))
                .expect("a routed path is /service/method");
            assert!(!method.contains('/') && !service.is_empty() && !method.is_empty());
            let txn = found == Route::Unary(Repeat::Txn);
            assert_eq!(txn, path == "/etcdserverpb.KV/Txn");
            let alarm = found == Route::Unary(Repeat::Alarm);
            assert_eq!(alarm, path == "/etcdserverpb.Maintenance/Alarm");
        }
        None => {
            let status = unknown(path);
            assert_eq!(status.code(), Code::Unimplemented);
            let message = status.message();
            assert!(
                message.starts_with("unknown method ")
                    || message.starts_with("unknown service ")
                    || message.starts_with("malformed method name: "),
                "{message}"
            );
            assert!(keyed_method(path).is_none(), "{path} has keys but no route");
        }
    }
}
