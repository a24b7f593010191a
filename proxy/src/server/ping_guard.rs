//! A client connection that enforces [`PingPolicy`]: it watches the HTTP/2 frames going by in both directions (only
//! their headers), keeps track of the calls in progress, and when the client has pinged too often writes GOAWAY
//! `ENHANCE_YOUR_CALM` "too_many_pings" between two of the server's frames, closes its side, and reports the end of
//! the connection to the HTTP/2 server above it. HTTP/1.1 connections (the admin routes) pass through untouched.

use std::collections::HashSet;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::frames::{self, FrameCursor, FrameHeader};
use super::ping_policy::PingPolicy;

/// How long a connection being ended reads (and drops) what the client still sends, so that closing it does not
/// reset it before the client has read the GOAWAY.
const DRAIN: Duration = Duration::from_secs(1);

pub struct PingGuard<IO> {
    io: IO,
    protocol: Protocol,
    inbound: FrameCursor,
    outbound: FrameCursor,
    policy: PingPolicy,
    /// Calls the client opened that the server has not finished.
    open_streams: HashSet<u32>,
    last_stream: u32,
    closing: Option<Closing>,
}

enum Protocol {
    /// Comparing the first bytes with HTTP/2's client preface; this many matched so far.
    Sniffing(usize),
    Http2,
    Other,
}

enum Closing {
    GoAway { frame: Vec<u8>, written: usize },
    Flush,
    Shutdown,
    Drain(Pin<Box<Sleep>>),
    Closed,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> PingGuard<IO> {
    /// `min_time`: as [`PingPolicy::new`]; `None` passes everything through unwatched.
    pub fn new(io: IO, min_time: Option<Duration>) -> Self {
        Self {
            io,
            protocol: match min_time {
                Some(_) => Protocol::Sniffing(0),
                None => Protocol::Other,
            },
            inbound: FrameCursor::default(),
            outbound: FrameCursor::default(),
            policy: PingPolicy::new(min_time.unwrap_or_default()),
            open_streams: HashSet::new(),
            last_stream: 0,
            closing: None,
        }
    }

    /// Follows what the client sent; returns whether it pinged too often.
    fn received(&mut self, mut bytes: &[u8]) -> bool {
        if let Protocol::Sniffing(matched) = self.protocol {
            let n = (frames::CLIENT_PREFACE.len() - matched).min(bytes.len());
            if bytes[..n] != frames::CLIENT_PREFACE[matched..matched + n] {
                self.protocol = Protocol::Other;
                return false;
            }
            self.protocol = if matched + n == frames::CLIENT_PREFACE.len() {
                Protocol::Http2
            } else {
                Protocol::Sniffing(matched + n)
            };
            bytes = &bytes[n..];
        }
        if !matches!(self.protocol, Protocol::Http2) {
            return false;
        }
        let now = Instant::now();
        let mut too_many = false;
        let Self {
            inbound,
            policy,
            open_streams,
            last_stream,
            ..
        } = self;
        inbound.feed(
            bytes,
            |FrameHeader {
                 kind,
                 flags,
                 stream,
             }| match kind {
                frames::HEADERS if stream > *last_stream => {
                    *last_stream = stream;
                    open_streams.insert(stream);
                }
                frames::RST_STREAM => {
                    open_streams.remove(&stream);
                }
                frames::PING if flags & frames::ACK == 0 => {
                    too_many |= policy.ping(now, !open_streams.is_empty());
                }
                _ => {}
            },
        );
        too_many
    }

    /// Follows what the server sent.
    fn sent(&mut self, bytes: &[u8]) {
        if !matches!(self.protocol, Protocol::Http2) {
            return;
        }
        let Self {
            outbound,
            policy,
            open_streams,
            ..
        } = self;
        outbound.feed(
            bytes,
            |FrameHeader {
                 kind,
                 flags,
                 stream,
             }| match kind {
                frames::HEADERS | frames::DATA => {
                    policy.sent_to_client();
                    if flags & frames::END_STREAM != 0 {
                        open_streams.remove(&stream);
                    }
                }
                frames::RST_STREAM => {
                    open_streams.remove(&stream);
                }
                _ => {}
            },
        );
    }

    fn start_closing(&mut self) {
        tracing::debug!("a client pinged too often: ending its connection (too_many_pings)");
        // A GOAWAY written in the middle of one of the server's frames would corrupt both; then the connection
        // just closes.
        self.closing = Some(if self.outbound.at_boundary() {
            Closing::GoAway {
                frame: frames::goaway(
                    self.last_stream,
                    frames::ENHANCE_YOUR_CALM,
                    b"too_many_pings",
                ),
                written: 0,
            }
        } else {
            Closing::Shutdown
        });
    }

    /// Writes the GOAWAY, closes the write side, drains the client for a while; ready when the HTTP/2 server
    /// above should see the end of the connection.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let io = &mut self.io;
        let Some(closing) = &mut self.closing else {
            return Poll::Ready(());
        };
        loop {
            *closing = match closing {
                Closing::GoAway { frame, written } => {
                    match ready!(Pin::new(&mut *io).poll_write(cx, &frame[*written..])) {
                        Ok(n) if n > 0 => {
                            *written += n;
                            if *written < frame.len() {
                                continue;
                            }
                            Closing::Flush
                        }
                        _ => Closing::Closed,
                    }
                }
                Closing::Flush => match ready!(Pin::new(&mut *io).poll_flush(cx)) {
                    Ok(()) => Closing::Shutdown,
                    Err(_) => Closing::Closed,
                },
                Closing::Shutdown => {
                    let _ = ready!(Pin::new(&mut *io).poll_shutdown(cx));
                    Closing::Drain(Box::pin(tokio::time::sleep(DRAIN)))
                }
                Closing::Drain(deadline) => {
                    if deadline.as_mut().poll(cx).is_ready() {
                        Closing::Closed
                    } else {
                        let mut scratch = [0u8; 1024];
                        let mut buf = ReadBuf::new(&mut scratch);
                        match ready!(Pin::new(&mut *io).poll_read(cx, &mut buf)) {
                            Ok(()) if !buf.filled().is_empty() => continue,
                            _ => Closing::Closed,
                        }
                    }
                }
                Closing::Closed => return Poll::Ready(()),
            };
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingGuard<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closing.is_none() {
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
            if !this.received(&buf.filled()[before..]) {
                return Poll::Ready(Ok(()));
            }
            // The server above never sees the offending bytes; the connection is ending.
            buf.set_filled(before);
            this.start_closing();
        }
        ready!(this.poll_close(cx));
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PingGuard<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            // Ending: what the server still writes is dropped, so the GOAWAY stays the last frame.
            return Poll::Ready(Ok(buf.len()));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        this.sent(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()));
        }
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for buf in bufs {
            let taken = left.min(buf.len());
            this.sent(&buf[..taken]);
            left -= taken;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closing.is_some() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    const MIN: Duration = Duration::from_millis(100);

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn too_many_pings(last_stream: u32) -> Vec<u8> {
        frames::goaway(last_stream, frames::ENHANCE_YOUR_CALM, b"too_many_pings")
    }

    fn ping() -> Vec<u8> {
        frame(frames::PING, 0, 0, &[0; 8])
    }

    /// A client end, and the server end behind a guard whose reads are pumped by a task (as the HTTP/2 server
    /// would) that reports everything it was given once the guard reports the end.
    fn connect(
        min_time: Option<Duration>,
    ) -> (
        DuplexStream,
        tokio::task::JoinHandle<Vec<u8>>,
        tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    ) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (write, mut to_write) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let pump = tokio::spawn(async move {
            let mut guard = PingGuard::new(server, min_time);
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                tokio::select! {
                    biased;
                    n = guard.read(&mut buf) => match n {
                        Ok(0) | Err(_) => return seen,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    },
                    Some(bytes) = to_write.recv() => guard.write_all(&bytes).await.unwrap(),
                }
            }
        });
        (client, pump, write)
    }

    /// Lets the pump take in what the client sent (as the HTTP/2 server reads the preface before it writes).
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    async fn read_to_end(client: &mut DuplexStream) -> Vec<u8> {
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_pings_gets_goaway_enhance_your_calm_and_the_end() {
        let (mut client, pump, _write) = connect(Some(MIN));
        let mut sent = frames::CLIENT_PREFACE.to_vec();
        sent.extend(frame(frames::HEADERS, 0x4, 1, b""));
        client.write_all(&sent).await.unwrap();
        for _ in 0..4 {
            client.write_all(&ping()).await.unwrap();
        }
        let received = read_to_end(&mut client).await;
        assert_eq!(received, too_many_pings(1));
        let seen = pump.await.unwrap();
        let all = [sent, ping(), ping(), ping(), ping()].concat();
        assert!(all.starts_with(&seen));
        assert!(
            seen.len() < all.len(),
            "the server above never saw the last ping"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pings_at_the_minimum_interval_during_a_call_are_answered_by_the_server() {
        let (mut client, pump, _write) = connect(Some(MIN));
        let mut sent = frames::CLIENT_PREFACE.to_vec();
        sent.extend(frame(frames::HEADERS, 0x4, 1, b""));
        client.write_all(&sent).await.unwrap();
        for _ in 0..20 {
            client.write_all(&ping()).await.unwrap();
            tokio::time::sleep(MIN).await;
        }
        drop(client);
        let seen = pump.await.unwrap();
        assert_eq!(seen.len(), sent.len() + 20 * ping().len());
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_call_even_spaced_pings_are_too_many() {
        let (mut client, _pump, _write) = connect(Some(MIN));
        client.write_all(frames::CLIENT_PREFACE).await.unwrap();
        for _ in 0..4 {
            client.write_all(&ping()).await.unwrap();
            tokio::time::sleep(MIN * 10).await;
        }
        let received = read_to_end(&mut client).await;
        assert_eq!(received, too_many_pings(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_call_no_longer_counts_as_open() {
        let (mut client, _pump, write) = connect(Some(MIN));
        let mut sent = frames::CLIENT_PREFACE.to_vec();
        sent.extend(frame(frames::HEADERS, 0x5, 1, b""));
        client.write_all(&sent).await.unwrap();
        settle().await;
        let trailers = frame(frames::HEADERS, 0x5, 1, b"");
        write.send(trailers.clone()).unwrap();
        let mut got = vec![0; trailers.len()];
        client.read_exact(&mut got).await.unwrap();
        // The trailers forgive the next ping; the three after it strike.
        for _ in 0..4 {
            client.write_all(&ping()).await.unwrap();
            tokio::time::sleep(MIN * 2).await;
        }
        assert_eq!(read_to_end(&mut client).await, too_many_pings(1));
    }

    #[tokio::test(start_paused = true)]
    async fn in_the_middle_of_a_server_frame_the_connection_closes_without_goaway() {
        let (mut client, _pump, write) = connect(Some(MIN));
        let mut sent = frames::CLIENT_PREFACE.to_vec();
        sent.extend(frame(frames::HEADERS, 0x4, 1, b""));
        client.write_all(&sent).await.unwrap();
        settle().await;
        let data = frame(frames::DATA, 0, 1, &[7; 100]);
        write.send(data[..50].to_vec()).unwrap();
        let mut got = vec![0; 50];
        client.read_exact(&mut got).await.unwrap();
        for _ in 0..4 {
            client.write_all(&ping()).await.unwrap();
        }
        assert_eq!(read_to_end(&mut client).await, b"");
    }

    #[tokio::test(start_paused = true)]
    async fn http1_and_unpoliced_connections_pass_through() {
        for (min_time, first) in [
            (Some(MIN), b"GET /health HTTP/1.1\r\n\r\n".to_vec()),
            (None, frames::CLIENT_PREFACE.to_vec()),
        ] {
            let (mut client, pump, _write) = connect(min_time);
            let mut sent = first;
            for _ in 0..10 {
                sent.extend(ping());
            }
            client.write_all(&sent).await.unwrap();
            drop(client);
            assert_eq!(pump.await.unwrap(), sent);
        }
    }
}
