//! Production networking: real TCP sockets through tokio.
#![allow(clippy::disallowed_types)] // this is the one place allowed to open sockets

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

use super::{Accepted, BoxFuture, Conn, Listener, Net};

/// Real TCP, with `TCP_NODELAY` on every connection (gRPC messages are small and latency-bound).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioNet;

struct TokioListener(TcpListener);

impl Listener for TokioListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Accepted, SocketAddr)>> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            stream.set_nodelay(true)?;
            // Taken off this runtime's reactor (it stays non-blocking), and registered with the serving one's.
            let stream = stream.into_std()?;
            let open = move || Ok(Box::new(TcpStream::from_std(stream)?) as Conn);
            Ok((Accepted::deferred(open), peer))
        })
    }
}

impl Net for TokioNet {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            Ok(Box::new(TokioListener(TcpListener::bind(addr).await?)) as Box<dyn Listener>)
        })
    }

    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>> {
        Box::pin(async move {
            let stream = TcpStream::connect(authority.as_str()).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as Conn)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    /// A connection accepted on one runtime and opened on another is served by the second alone: it keeps working
    /// after the first is gone, which it would not if its readiness were still polled there.
    #[test]
    fn an_accepted_connection_belongs_to_the_runtime_that_opens_it() {
        let (accepting, serving) = (runtime(), runtime());
        let mut listener = accepting
            .block_on(TokioNet.bind(([127, 0, 0, 1], 0).into()))
            .expect("a listener");
        let addr = listener.local_addr().expect("its address").to_string();
        // The kernel completes the handshake before the accept.
        let mut client = serving.block_on(TokioNet.connect(addr)).expect("connected");
        let (accepted, _) = accepting.block_on(listener.accept()).expect("accepted");
        drop(listener);
        drop(accepting);
        let got = serving.block_on(async {
            let mut conn = accepted.open().expect("opened here");
            client.write_all(b"ping").await.expect("sent");
            let mut got = [0u8; 4];
            conn.read_exact(&mut got)
                .await
                .expect("read on the serving runtime");
            conn.write_all(b"pong").await.expect("answered");
            client.read_exact(&mut got).await.expect("the answer");
            got
        });
        assert_eq!(&got, b"pong");
    }
}
