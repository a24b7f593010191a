//! Macros that forward one call of a generated etcd client through the [`Upstream`](super::Upstream).

/// Forwards one unary call upstream with the given retry policy:
/// `forward_unary!(upstream, Retry::ReadOnly, request, KvClient::range)`.
///
/// The generated client gets the proxy's receive limit (what it accepts from etcd); the send limit is checked by
/// the upstream itself, before any attempt, so that an oversized request is rejected with etcd's error.
macro_rules! forward_unary {
    ($upstream:expr, $retry:expr, $request:expr, $client:ident :: $method:ident) => {{
        let max_recv = $upstream.max_recv_bytes;
        $upstream
            .unary($retry, $request, move |channel, request| async move {
                $client::new(channel)
                    .max_decoding_message_size(max_recv)
                    .max_encoding_message_size(usize::MAX)
                    .$method(request)
                    .await
            })
            .await
    }};
}

/// Forwards a call with a stream of responses: `forward_server_stream!(upstream, request, MaintenanceClient::snapshot)`.
macro_rules! forward_server_stream {
    ($upstream:expr, $request:expr, $client:ident :: $method:ident) => {{
        let max_recv = $upstream.max_recv_bytes;
        $upstream
            .server_stream($request, move |channel, request| async move {
                $client::new(channel)
                    .max_decoding_message_size(max_recv)
                    .max_encoding_message_size(usize::MAX)
                    .$method(request)
                    .await
            })
            .await
    }};
}

pub(crate) use {forward_server_stream, forward_unary};
