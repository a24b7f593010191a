//! A streaming call's request body: JSON values one after another (`{"create_request":...} {"cancel_request":...}`),
//! as etcd's gateway reads a Watch or LeaseKeepAlive body, turned into the gRPC frames of its in-process call.
//!
//! As in etcd's gateway, the request stream ends (the call is half-closed, its answers keep coming) when the body
//! ends or holds something that is not a request.

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http_body::{Body as HttpBody, Frame};
use http_body_util::BodyExt;
use prost_reflect::MessageDescriptor;

use super::frames::frame;
use super::json;

/// What the stream needs to read one more request.
struct Reader<B> {
    body: B,
    buffer: BytesMut,
    message: MessageDescriptor,
    /// The most bytes one request may take as JSON.
    max_request_bytes: usize,
}

/// The gRPC frames of the JSON requests in `body`.
pub fn frames<B>(
    body: B,
    message: MessageDescriptor,
    max_request_bytes: usize,
) -> impl Stream<Item = Result<Frame<Bytes>, tonic::Status>> + Send + 'static
where
    B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    let reader = Reader {
        body,
        buffer: BytesMut::new(),
        message,
        max_request_bytes,
    };
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let request = reader.next_request().await?;
        Some((Ok(Frame::data(frame(&request))), Some(reader)))
    })
}

impl<B> Reader<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// The next request's protobuf bytes, or `None` when the request stream ends.
    async fn next_request(&mut self) -> Option<Bytes> {
        loop {
            match self.parse_one() {
                Parsed::Request(bytes) => return Some(bytes),
                Parsed::End => return None,
                Parsed::NeedMore => {}
            }
            if self.buffer.len() > self.max_request_bytes {
                tracing::debug!(
                    limit = self.max_request_bytes,
                    "gateway stream request larger than the limit: ending the request stream"
                );
                return None;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(err)) => {
                    tracing::debug!(%err, "gateway stream request body failed");
                    return None;
                }
                None => {
                    // The body ended: whatever is left is a request cut short, or nothing.
                    return match self.parse_one() {
                        Parsed::Request(bytes) => Some(bytes),
                        Parsed::End | Parsed::NeedMore => None,
                    };
                }
            }
        }
    }

    fn parse_one(&mut self) -> Parsed {
        let mut values =
            serde_json::Deserializer::from_slice(&self.buffer).into_iter::<serde_json::Value>();
        match values.next() {
            None => Parsed::NeedMore,
            Some(Err(err)) if err.is_eof() => Parsed::NeedMore,
            Some(Err(err)) => {
                tracing::debug!(%err, "gateway stream request is not JSON: ending the request stream");
                Parsed::End
            }
            Some(Ok(value)) => {
                let consumed = values.byte_offset();
                self.buffer.advance(consumed);
                if consumed > self.max_request_bytes {
                    tracing::debug!(
                        limit = self.max_request_bytes,
                        "gateway stream request larger than the limit: ending the request stream"
                    );
                    return Parsed::End;
                }
                match json::stream_request(&self.message, value) {
                    Ok(bytes) => Parsed::Request(bytes),
                    Err(json::BadJson(err)) => {
                        tracing::debug!(%err, "gateway stream request is not a request: ending the request stream");
                        Parsed::End
                    }
                }
            }
        }
    }
}

enum Parsed {
    Request(Bytes),
    NeedMore,
    End,
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::StreamBody;
    use prost::Message as _;
    use proto::etcdserverpb::{WatchRequest, watch_request};

    fn watch_request() -> MessageDescriptor {
        super::super::json::Method::of("/etcdserverpb.Watch/Watch")
            .expect("Watch")
            .input
    }

    async fn requests(chunks: &[&str]) -> Vec<WatchRequest> {
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c.as_bytes()))))
            .collect();
        let body = StreamBody::new(futures::stream::iter(chunks));
        frames(body, watch_request(), 1024)
            .map(|f| {
                let data = f.expect("no error").into_data().expect("data");
                WatchRequest::decode(&data[5..]).expect("a WatchRequest")
            })
            .collect()
            .await
    }

    fn created_key(request: &WatchRequest) -> Vec<u8> {
        match &request.request_union {
            Some(watch_request::RequestUnion::CreateRequest(create)) => create.key.clone(),
            other => panic!("not a create request: {other:?}"),
        }
    }

    #[tokio::test]
    async fn values_split_anywhere_become_requests() {
        let got = requests(&[
            r#"{"create_request":{"key":"YQ=="}}  {"create_"#,
            r#"request":{"key":"Yg=="}}"#,
            "\n",
        ])
        .await;
        assert_eq!(
            got.iter().map(created_key).collect::<Vec<_>>(),
            [b"a", b"b"]
        );
    }

    #[tokio::test]
    async fn something_not_a_request_ends_the_stream() {
        let got = requests(&[r#"{"create_request":{"key":"YQ=="}} {"create_request":{"key":5}} {"create_request":{}}"#]).await;
        assert_eq!(got.len(), 1);
        let got = requests(&[r#"{"create_request":{"key":"YQ=="}} }"#]).await;
        assert_eq!(got.len(), 1);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_limit_ends_the_stream() {
        let big = format!(r#"{{"create_request":{{"key":"{}"}}}}"#, "QUFB".repeat(400));
        assert!(requests(&[&big[..800], &big[800..]]).await.is_empty());
    }
}
