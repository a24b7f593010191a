//! gRPC's length-prefixed messages, as the gateway writes them into its in-process calls and reads them back.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// One message as a gRPC frame: uncompressed flag, 4-byte big-endian length, the message.
pub fn frame(message: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0);
    framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    framed.put_slice(message);
    framed.freeze()
}

/// The messages of a response body, taken off as their bytes arrive.
#[derive(Default)]
pub struct Deframer {
    buffer: BytesMut,
}

/// A frame the proxy did not write: compressed (the proxy never asks for compression) or cut short at the end.
#[derive(Debug, PartialEq, Eq)]
pub struct BadFrame;

impl Deframer {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole message, if its bytes have all arrived.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, BadFrame> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        if self.buffer[0] != 0 {
            return Err(BadFrame);
        }
        let length = u32::from_be_bytes([
            self.buffer[1],
            self.buffer[2],
            self.buffer[3],
            self.buffer[4],
        ]) as usize;
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }

    /// Whether bytes of an unfinished message are left (at the end of the body, a message cut short).
    pub fn has_partial(&self) -> bool {
        !self.buffer.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_back_out_in_any_split() {
        let stream = [frame(b"one"), frame(b""), frame(b"three")].concat();
        for split in 0..stream.len() {
            let mut deframer = Deframer::default();
            let mut messages = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                deframer.push(part);
                while let Some(message) = deframer.next_message().expect("well framed") {
                    messages.push(message);
                }
            }
            assert_eq!(messages, [&b"one"[..], b"", b"three"], "split at {split}");
            assert!(!deframer.has_partial());
        }
    }

    #[test]
    fn compressed_and_cut_frames_are_told() {
        let mut deframer = Deframer::default();
        deframer.push(&[1, 0, 0, 0, 0]);
        assert_eq!(deframer.next_message(), Err(BadFrame));
        let mut deframer = Deframer::default();
        deframer.push(&frame(b"abc")[..6]);
        assert_eq!(deframer.next_message(), Ok(None));
        assert!(deframer.has_partial());
    }
}
