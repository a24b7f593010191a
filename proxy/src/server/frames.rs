//! Frame boundaries in one direction of an HTTP/2 connection, seen from the bytes going by: only the 9-byte frame
//! headers are read, payloads are skipped by their length. Nothing is buffered beyond one partial header.

/// The client connection preface (RFC 9113 §3.4); the server's first bytes are already a frame.
pub const CLIENT_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
/// On DATA and HEADERS.
pub const END_STREAM: u8 = 0x1;
/// On PING.
pub const ACK: u8 = 0x1;

/// HTTP/2's ENHANCE_YOUR_CALM error code.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

/// Where the next frame header starts in a byte stream.
#[derive(Debug, Default)]
pub struct FrameCursor {
    /// Bytes still to pass before the next header: the rest of a payload.
    skip: usize,
    header: [u8; 9],
    /// How much of `header` has arrived.
    have: usize,
}

impl FrameCursor {
    /// Passes `bytes`, calling `on_header` for every frame header completed in them.
    pub fn feed(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(FrameHeader)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                self.have = 0;
                let h = &self.header;
                self.skip = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                on_header(FrameHeader {
                    kind: h[3],
                    flags: h[4],
                    stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                });
            }
        }
    }

    /// Whether the bytes passed so far end exactly at a frame's end: a frame written now would not split another.
    pub fn at_boundary(&self) -> bool {
        self.skip == 0 && self.have == 0
    }
}

/// A GOAWAY frame (RFC 9113 §6.8) on stream 0.
pub fn goaway(last_stream: u32, code: u32, debug: &[u8]) -> Vec<u8> {
    let len = 8 + debug.len() as u32;
    let mut frame = Vec::with_capacity(9 + len as usize);
    frame.extend_from_slice(&len.to_be_bytes()[1..]);
    frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frame.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    frame.extend_from_slice(&code.to_be_bytes());
    frame.extend_from_slice(debug);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn headers_are_found_however_the_bytes_are_split() {
        let mut stream = frame(HEADERS, 0x4, 1, &[1, 2, 3]);
        stream.extend(frame(PING, 0, 0, &[0; 8]));
        stream.extend(frame(DATA, END_STREAM, 1, &[9; 100]));
        let expected = vec![
            FrameHeader {
                kind: HEADERS,
                flags: 0x4,
                stream: 1,
            },
            FrameHeader {
                kind: PING,
                flags: 0,
                stream: 0,
            },
            FrameHeader {
                kind: DATA,
                flags: END_STREAM,
                stream: 1,
            },
        ];
        for chunk in [1, 2, 5, 9, 10, 17, stream.len()] {
            let mut cursor = FrameCursor::default();
            let mut seen = Vec::new();
            let mut boundaries = 0;
            for piece in stream.chunks(chunk) {
                cursor.feed(piece, |h| seen.push(h));
                boundaries += usize::from(cursor.at_boundary());
            }
            assert_eq!(seen, expected, "chunks of {chunk}");
            assert!(cursor.at_boundary());
            assert!(boundaries >= 1);
        }
    }

    #[test]
    fn a_partial_header_or_payload_is_not_a_boundary() {
        let mut cursor = FrameCursor::default();
        let f = frame(DATA, 0, 3, &[0; 4]);
        cursor.feed(&f[..5], |_| {});
        assert!(!cursor.at_boundary());
        cursor.feed(&f[5..11], |_| {});
        assert!(!cursor.at_boundary());
        cursor.feed(&f[11..], |_| {});
        assert!(cursor.at_boundary());
    }

    #[test]
    fn goaway_is_laid_out_as_rfc_9113_says() {
        let f = goaway(7, ENHANCE_YOUR_CALM, b"too_many_pings");
        assert_eq!(&f[..3], &[0, 0, 22]);
        assert_eq!(&f[3..9], &[GOAWAY, 0, 0, 0, 0, 0]);
        assert_eq!(&f[9..13], &7u32.to_be_bytes());
        assert_eq!(&f[13..17], &11u32.to_be_bytes());
        assert_eq!(&f[17..], b"too_many_pings");
    }
}
