//! A gRPC codec that does not decode: a message is the bytes of its protobuf encoding, carried as they came.
//!
//! Relaying bytes keeps every field etcd or the client sent, those this proxy's `.proto` files do not know
//! included, and spends no CPU on decoding and re-encoding messages the proxy has no reason to read.

use bytes::{Buf, BufMut, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Messages as their encoded bytes, in both directions.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // The buffer holds exactly one message (tonic has read its length prefix).
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
