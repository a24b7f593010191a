//! Production networking: real TCP sockets through tokio.
#![allow(clippy::disallowed_types)] // this is the one place allowed to open sockets

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

use super::{BoxFuture, Conn, Listener, Net};

/// Real TCP, with `TCP_NODELAY` on every connection (gRPC messages are small and latency-bound).
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioNet;

struct TokioListener(TcpListener);

impl Listener for TokioListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Conn, SocketAddr)>> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            stream.set_nodelay(true)?;
            Ok((Box::new(stream) as Conn, peer))
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
