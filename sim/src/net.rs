//! [`TurmoilNet`]: the proxy's `Net` seam over turmoil's simulated TCP, so the production proxy, the model members
//! and the clients all talk through one simulated network that faults can cut, delay and hold.

use std::io;
use std::net::SocketAddr;

use proxy::net::{BoxFuture, Conn, Listener, Net};

/// Simulated TCP. Must be used from inside a turmoil host or client; host names resolve through turmoil's DNS.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurmoilNet;

struct TurmoilListener(turmoil::net::TcpListener);

impl Listener for TurmoilListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Conn, SocketAddr)>> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            Ok((Box::new(stream) as Conn, peer))
        })
    }
}

impl Net for TurmoilNet {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            Ok(Box::new(TurmoilListener(listener)) as Box<dyn Listener>)
        })
    }

    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority.as_str()).await?;
            Ok(Box::new(stream) as Conn)
        })
    }
}
