//! etcd's messages to and from JSON, by their descriptors (protobuf's JSON mapping, as etcd's gateway writes it):
//! proto field names, 64-bit integers as strings, bytes as base64, enums by name, fields at their default left out.

use std::sync::LazyLock;

use bytes::Bytes;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(proto::FILE_DESCRIPTOR_SET)
        .expect("the proto crate's descriptor set is valid")
});

/// The request and response messages of one gRPC method, and whether each side streams.
#[derive(Clone)]
pub struct Method {
    pub input: MessageDescriptor,
    pub output: MessageDescriptor,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

impl Method {
    /// The method of a gRPC path such as `/etcdserverpb.KV/Range`.
    pub fn of(grpc_path: &str) -> Option<Method> {
        let (service, method) = grpc_path.strip_prefix('/')?.split_once('/')?;
        let method = POOL
            .get_service_by_name(service)?
            .methods()
            .find(|m| m.name() == method)?;
        Some(Method {
            input: method.input(),
            output: method.output(),
            client_streaming: method.is_client_streaming(),
            server_streaming: method.is_server_streaming(),
        })
    }
}

/// A request body that is not the JSON of its message: the text is the JSON parser's own, but for a body cut
/// short, which gets Go's words as etcd's gateway answers it ("unexpected EOF").
#[derive(Debug)]
pub struct BadJson(pub String);

impl BadJson {
    fn from_serde(err: &serde_json::Error) -> BadJson {
        if err.is_eof() {
            BadJson("unexpected EOF".to_string())
        } else {
            BadJson(err.to_string())
        }
    }
}

/// The protobuf encoding of one JSON request. As etcd's gateway reads a body, an empty one is the empty request,
/// fields the message does not have and enum names the enum does not have are skipped (etcd 3.4 and 3.5.1 refuse the
/// latter), and whatever follows the first JSON value is not read.
pub fn request(message: &MessageDescriptor, json: &[u8]) -> Result<Bytes, BadJson> {
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(Bytes::new());
    }
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    decode(message, &mut deserializer)
}

/// The protobuf encoding of one JSON value of a request stream.
pub fn stream_request(
    message: &MessageDescriptor,
    value: serde_json::Value,
) -> Result<Bytes, BadJson> {
    decode(message, value)
}

fn decode<'de, D>(message: &MessageDescriptor, deserializer: D) -> Result<Bytes, BadJson>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
{
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    DynamicMessage::deserialize_with_options(message.clone(), deserializer, &options)
        .map(|decoded| Bytes::from(decoded.encode_to_vec()))
        .map_err(|e| BadJson::from_serde(&e))
}

/// The JSON of one response message, or `None` if etcd's bytes are not that message (relayed answers are never
/// decoded elsewhere, so this is where a malformed answer would show).
pub fn response(message: &MessageDescriptor, bytes: &[u8]) -> Option<Bytes> {
    write(message, bytes, b"", b"")
}

/// One answer of a stream as etcd's gateway writes it: `{"result":<the message's JSON>}` and a newline.
pub fn result_line(message: &MessageDescriptor, bytes: &[u8]) -> Option<Bytes> {
    write(message, bytes, b"{\"result\":", b"}\n")
}

/// The message's JSON between `before` and `after`, written straight into one buffer: a watch event goes out to
/// every gateway watcher of its key, each with its own answer, so this is the gateway's hottest path.
fn write(message: &MessageDescriptor, bytes: &[u8], before: &[u8], after: &[u8]) -> Option<Bytes> {
    let decoded = DynamicMessage::decode(message.clone(), bytes).ok()?;
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(true)
        .stringify_64_bit_integers(true);
    let mut out = Vec::with_capacity(before.len() + 2 * bytes.len() + 64 + after.len());
    out.extend_from_slice(before);
    decoded
        .serialize_with_options(&mut serde_json::Serializer::new(&mut out), &options)
        .ok()?;
    out.extend_from_slice(after);
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
    use proto::mvccpb::KeyValue;

    fn range() -> Method {
        Method::of("/etcdserverpb.KV/Range").expect("Range is a method")
    }

    #[test]
    fn requests_read_protobufs_json_mapping() {
        let json = br#"{"key":"Zm9v","range_end":"Zm9w","limit":"2","sort_order":"DESCEND","serializable":true}"#;
        let bytes = request(&range().input, json).expect("valid");
        let decoded = RangeRequest::decode(bytes).expect("a RangeRequest");
        assert_eq!(decoded.key, b"foo");
        assert_eq!(decoded.range_end, b"fop");
        assert_eq!(decoded.limit, 2);
        assert_eq!(decoded.sort_order, 2);
        assert!(decoded.serializable);
        // Numbers may come as numbers too, and enums by number.
        let bytes = request(&range().input, br#"{"limit":3,"sort_order":1}"#).expect("valid");
        assert_eq!(RangeRequest::decode(bytes).expect("decodes").limit, 3);
    }

    #[test]
    fn an_empty_body_is_the_empty_request() {
        let bytes = request(&range().input, b" \n").expect("empty is valid");
        assert!(bytes.is_empty());
    }

    #[test]
    fn unknown_fields_enum_names_and_what_follows_the_first_value_are_skipped() {
        let bytes =
            request(&range().input, br#"{"key":"Zm9v","nope":1} trailing"#).expect("skipped");
        assert_eq!(RangeRequest::decode(bytes).expect("decodes").key, b"foo");
    }

    #[test]
    fn malformed_json_is_refused() {
        for bad in [
            &b"{\"key\":1}"[..],
            b"[]",
            b"hello",
            b"{\"limit\":\"x\"}",
            b"{\"key\":\"!!\"}",
        ] {
            assert!(
                request(&range().input, bad).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(bad)
            );
        }
        let cut = request(&range().input, br#"{"key":"#).expect_err("cut short");
        assert_eq!(cut.0, "unexpected EOF");
    }

    #[test]
    fn txns_nest_42_deep_in_json_and_no_deeper() {
        let txn = Method::of("/etcdserverpb.KV/Txn").expect("Txn").input;
        let nested = |depth: usize| {
            let inner = r#"{"success":[{"request_range":{"key":"Zm9v"}}]}"#;
            let open = r#"{"success":[{"request_txn":"#.repeat(depth - 1);
            format!("{open}{inner}{}", "}]}".repeat(depth - 1))
        };
        assert!(request(&txn, nested(42).as_bytes()).is_ok());
        assert!(request(&txn, nested(43).as_bytes()).is_err());
    }

    #[test]
    fn responses_are_written_as_etcds_gateway_writes_them() {
        let answer = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 14841639068965178418,
                revision: 5,
                ..Default::default()
            }),
            kvs: vec![KeyValue {
                key: b"foo".to_vec().into(),
                value: b"bar".to_vec().into(),
                mod_revision: 5,
                ..Default::default()
            }],
            count: 1,
            more: false,
        };
        let written = response(&range().output, &answer.encode_to_vec()).expect("decodes");
        let json: serde_json::Value = serde_json::from_slice(&written).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({
                "header": {"cluster_id": "14841639068965178418", "revision": "5"},
                "kvs": [{"key": "Zm9v", "value": "YmFy", "mod_revision": "5"}],
                "count": "1",
            })
        );
    }

    #[test]
    fn stream_answers_are_result_lines() {
        let watch = Method::of("/etcdserverpb.Watch/Watch").expect("Watch");
        let answer = proto::etcdserverpb::WatchResponse {
            watch_id: 7,
            created: true,
            ..Default::default()
        };
        let line = result_line(&watch.output, &answer.encode_to_vec()).expect("decodes");
        assert_eq!(
            line,
            Bytes::from_static(b"{\"result\":{\"watch_id\":\"7\",\"created\":true}}\n")
        );
    }

    #[test]
    fn every_gateway_path_has_its_method_and_messages() {
        let watch = Method::of("/etcdserverpb.Watch/Watch").expect("Watch");
        assert!(watch.client_streaming && watch.server_streaming);
        let observe = Method::of("/v3electionpb.Election/Observe").expect("Observe");
        assert!(!observe.client_streaming && observe.server_streaming);
        assert!(Method::of("/etcdserverpb.KV/Nope").is_none());
    }
}
