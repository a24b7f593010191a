//! The deadline of a client connection's setup (`--client-setup-timeout`): a connection that has not sent its
//! HTTP/2 client preface and first frame (gRPC, or HTTP/2 to the admin routes) or a whole HTTP/1.1 request head
//! by then is closed, and its place among `--max-client-connections` freed. grpc-go closes a connection that has
//! not sent its preface within 120 s, its default; without a deadline, sockets that never send a byte would hold
//! every place for good. Once set up, a connection lives as long as its client keeps it, as on etcd.
//!
//! The TLS handshake counts against the same deadline ([`Serving`](super) starts the clock at accept); this wrapper
//! watches the decrypted bytes, before the ping guard and the HTTP server read them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::frames::{CLIENT_PREFACE, FrameCursor};

/// How far a connection's first bytes are from a finished setup.
#[derive(Debug)]
pub enum Progress {
    /// Comparing the first bytes with HTTP/2's client preface; this many matched so far.
    Sniffing(usize),
    /// The preface came; waiting for the first frame's header (a SETTINGS frame, by RFC 9113).
    FirstFrame(FrameCursor),
    /// Not HTTP/2: waiting for the blank line that ends an HTTP/1.1 request head; the last four bytes read, to
    /// find one split across reads.
    RequestHead(u32),
    Done,
}

impl Default for Progress {
    fn default() -> Self {
        Progress::Sniffing(0)
    }
}

impl Progress {
    /// Follows bytes the client sent; returns whether the setup is now finished.
    pub fn received(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match self {
                Progress::Sniffing(matched) => {
                    let n = (CLIENT_PREFACE.len() - *matched).min(bytes.len());
                    if bytes[..n] != CLIENT_PREFACE[*matched..*matched + n] {
                        // What matched so far is also the start of a request head ("PRI * HTTP/2.0\r\n\r\n" is a
                        // whole one), read on from there.
                        let mut head = Progress::RequestHead(0);
                        head.received(&CLIENT_PREFACE[..*matched]);
                        *self = head;
                        continue;
                    }
                    *matched += n;
                    bytes = &bytes[n..];
                    if *matched == CLIENT_PREFACE.len() {
                        *self = Progress::FirstFrame(FrameCursor::default());
                    }
                }
                Progress::FirstFrame(cursor) => {
                    let mut seen = false;
                    cursor.feed(bytes, |_| seen = true);
                    if seen {
                        *self = Progress::Done;
                    }
                    bytes = &[];
                }
                Progress::RequestHead(window) => {
                    let blank_line = u32::from_be_bytes(*b"\r\n\r\n");
                    for (i, byte) in bytes.iter().enumerate() {
                        *window = *window << 8 | u32::from(*byte);
                        if *window == blank_line {
                            *self = Progress::Done;
                            bytes = &bytes[i + 1..];
                            break;
                        }
                    }
                    if !matches!(self, Progress::Done) {
                        bytes = &[];
                    }
                }
                Progress::Done => bytes = &[],
            }
        }
        matches!(self, Progress::Done)
    }
}

/// A client connection that fails its reads with `TimedOut` if its setup is not finished by a deadline.
pub struct SetupDeadline<IO> {
    io: IO,
    progress: Progress,
    /// `None` once set up.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<IO> SetupDeadline<IO> {
    pub fn new(io: IO, deadline: Instant) -> Self {
        Self {
            io,
            progress: Progress::default(),
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SetupDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(deadline) = &mut this.deadline else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.progress.received(&buf.filled()[before..]) {
                    this.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => {
                ready!(deadline.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client did not finish its connection setup within --client-setup-timeout",
                )))
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SetupDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished_after(chunks: &[&[u8]]) -> Vec<bool> {
        let mut progress = Progress::default();
        chunks.iter().map(|c| progress.received(c)).collect()
    }

    #[test]
    fn http2_is_set_up_by_the_preface_and_the_first_frame_header() {
        let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
        let whole = [&CLIENT_PREFACE[..], &settings].concat();
        assert_eq!(finished_after(&[&whole]), [true]);
        // Byte by byte: done exactly at the frame header's last byte.
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        let done = finished_after(&bytes);
        assert_eq!(done.iter().position(|d| *d), Some(whole.len() - 1));
        assert_eq!(
            finished_after(&[&CLIENT_PREFACE[..]]),
            [false],
            "the preface alone"
        );
    }

    #[test]
    fn http1_is_set_up_by_a_whole_request_head_even_split_across_reads() {
        let head = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(finished_after(&[head]), [true]);
        for split in 1..head.len() {
            let done = finished_after(&[&head[..split], &head[split..]]);
            assert_eq!(done, [false, true], "split at {split}");
        }
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert_eq!(
            finished_after(&bytes).iter().position(|d| *d),
            Some(head.len() - 1)
        );
        // "PRI" starts both the preface and a request line of method PRI; a head that follows is still a head.
        assert_eq!(
            finished_after(&[b"PRI", b" / HTTP/1.1\r\n\r\n"]),
            [false, true]
        );
        assert_eq!(finished_after(&[b"PRI * HTTP/2.0\r\n\r\nXX"]), [true]);
        assert_eq!(
            finished_after(&[b"GET / HTTP/1.1\r\nHost: x\r\n"]),
            [false],
            "no blank line yet"
        );
        assert_eq!(
            finished_after(&[b"\0\0\0\0"]),
            [false],
            "garbage sets nothing up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_fails_its_read_at_the_deadline_and_a_set_up_one_never() {
        use tokio::io::AsyncReadExt;
        let (client, server) = tokio::io::duplex(1024);
        let deadline = Instant::now() + std::time::Duration::from_secs(120);
        let mut silent = SetupDeadline::new(server, deadline);
        let err = silent.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(Instant::now(), deadline, "not before the deadline");
        drop(client);

        let (mut client, server) = tokio::io::duplex(1024);
        let mut talker =
            SetupDeadline::new(server, Instant::now() + std::time::Duration::from_secs(1));
        tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0; 64];
        let n = talker.read(&mut head).await.unwrap();
        assert_eq!(n, 18);
        // Long past the deadline, a set-up connection still just waits for its client.
        let later =
            tokio::time::timeout(std::time::Duration::from_secs(3600), talker.read(&mut head))
                .await;
        assert!(later.is_err(), "still waiting after an hour: {later:?}");
    }
}
