//! The HTTP/2 frame follower (`server/frames.rs`) and the connection guard that uses it (`server/ping_guard.rs`).
//!
//! First byte even: the rest is a byte stream fed to a `FrameCursor` in chunks whose sizes the input chooses; the
//! headers it reports and where it says frames end must match a plain reading of the whole stream.
//! First byte odd: the rest is a script of client bytes, server bytes and waits, run through the ping guard over
//! an in-memory connection; the server must read the client's bytes unchanged, the client must get the server's
//! bytes unchanged, and a connection the guard ends must end with a well-formed GOAWAY written only between two
//! of the server's frames (or with no GOAWAY when the server was in the middle of one).
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use proxy::fuzzing::{
    ACK, CLIENT_PREFACE, ENHANCE_YOUR_CALM, FrameCursor, FrameHeader, GOAWAY, GuardStep, PING,
    goaway, ping_guard,
};

fuzz_target!(|data: &[u8]| {
    let [mode, rest @ ..] = data else {
        return;
    };
    if mode & 1 == 0 {
        follow(rest);
    } else {
        guard(*mode, rest);
    }
});

/// Headers and frame ends read from the whole stream at once.
fn plain_reading(stream: &[u8]) -> (Vec<FrameHeader>, Vec<usize>) {
    let (mut headers, mut ends, mut at) = (Vec::new(), vec![0], 0usize);
    while let Some(h) = stream.get(at..at + 9) {
        headers.push(FrameHeader {
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        });
        at += 9 + (usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]));
        ends.push(at);
    }
    (headers, ends)
}

fn follow(input: &[u8]) {
    let [count, rest @ ..] = input else {
        return;
    };
    let count = usize::from(*count % 8).min(rest.len());
    let (sizes, stream) = rest.split_at(count);
    let (expected, ends) = plain_reading(stream);
    let mut cursor = FrameCursor::default();
    assert!(cursor.at_boundary());
    let mut seen = Vec::new();
    let whole = sizes.iter().all(|&size| size == 0);
    let (mut fed, mut turn) = (0, 0);
    while fed < stream.len() {
        // A size of 0 feeds nothing, which must change nothing; sizes all 0: the stream at once.
        let size = if whole {
            stream.len()
        } else {
            usize::from(sizes[turn % sizes.len()])
        };
        turn += 1;
        let piece = &stream[fed..(fed + size).min(stream.len())];
        let before = cursor.at_boundary();
        cursor.feed(piece, |h| seen.push(h));
        fed += piece.len();
        if piece.is_empty() {
            assert_eq!(cursor.at_boundary(), before);
        }
        assert_eq!(
            cursor.at_boundary(),
            ends.contains(&fed),
            "after {fed} bytes"
        );
    }
    assert_eq!(seen, expected);
}

fn guard(mode: u8, script: &[u8]) {
    let min_time = match mode >> 1 {
        0 => None,
        n => Some(Duration::from_millis(u64::from(n) * 10)),
    };
    let mut steps = Vec::new();
    let mut client = Vec::new();
    let mut server = Vec::new();
    let mut rest = script;
    let mut first_client = true;
    while let [op, raw_len, more @ ..] = rest {
        let len = usize::from(*raw_len).min(more.len());
        match op % 4 {
            0 | 1 => {
                let mut bytes = more[..len].to_vec();
                rest = &more[len..];
                // Odd ops start the connection with the preface, so the fuzzer need not find it.
                if first_client && op % 4 == 1 {
                    bytes.splice(0..0, CLIENT_PREFACE.iter().copied());
                }
                first_client = false;
                client.extend_from_slice(&bytes);
                let read_size = usize::from(op >> 2) + 1;
                steps.push(GuardStep::Client { bytes, read_size });
            }
            2 => {
                let bytes = more[..len].to_vec();
                rest = &more[len..];
                // The server writes only once it has read the client's preface (hyper-util's auto builder reads it
                // to choose HTTP/2): the guard follows the server's frames from there on.
                if client.len() < CLIENT_PREFACE.len() {
                    continue;
                }
                server.extend_from_slice(&bytes);
                steps.push(GuardStep::Server(bytes));
            }
            _ => {
                steps.push(GuardStep::Wait(Duration::from_millis(
                    u64::from(*raw_len) * 5,
                )));
                rest = more;
            }
        }
    }
    let run = ping_guard(min_time, &steps);
    assert!(
        client.starts_with(&run.read_by_server),
        "the server reads what the client sent"
    );
    if !run.ended {
        assert_eq!(
            run.read_by_server, client,
            "every byte the client sent is read"
        );
        assert_eq!(
            run.sent_to_client, server,
            "every byte the server wrote reaches the client"
        );
        return;
    }
    assert!(min_time.is_some(), "an unwatched connection is never ended");
    let before = run.written_before_end;
    assert!(before <= server.len());
    assert_eq!(&run.sent_to_client[..before], &server[..before]);
    let tail = &run.sent_to_client[before..];
    let mut cursor = FrameCursor::default();
    cursor.feed(&server[..before], |_| {});
    if cursor.at_boundary() {
        assert_eq!(
            tail.len(),
            9 + 8 + 14,
            "a GOAWAY ends the connection: {tail:?}"
        );
        let last_stream = u32::from_be_bytes(tail[9..13].try_into().unwrap());
        assert_eq!(
            tail,
            goaway(last_stream, ENHANCE_YOUR_CALM, b"too_many_pings")
        );
        assert_eq!(tail[3], GOAWAY);
    } else {
        assert!(tail.is_empty(), "no GOAWAY in the middle of a server frame");
    }
    let client_frames = client
        .strip_prefix(CLIENT_PREFACE.as_slice())
        .expect("HTTP/2");
    let pings = plain_reading(client_frames)
        .0
        .iter()
        .filter(|h| h.kind == PING && h.flags & ACK == 0)
        .count();
    assert!(pings >= 4, "ended after {pings} pings");
}
