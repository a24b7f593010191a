//! DNS answers for `--discovery-srv` (`cli/srv/`): the SRV answer parser (`wire.rs`), the lookup that asks over
//! UDP and again over TCP for a truncated answer (`lookup.rs`, fed by fake servers, `srv_sockets.rs`'s part in
//! the binary being only the sockets), the choice of endpoints (`mod.rs`), and resolv.conf's parser.
//!
//! First byte even: the rest is one DNS message, parsed as the answer to a query for [`NAME`] with the ID its own
//! first two bytes carry, and also read as resolv.conf text. First byte odd: the rest is a list of datagrams and
//! TCP streams (each behind a two-byte length: datagrams until an empty one, then streams) that fake servers
//! answer `--discovery-srv=example.com` with, query IDs 0x1234 (https) and 0x1235 (http).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxy::fuzzing::{DnsScript, discover_srv, parse_answer, parse_resolv_conf};

const NAME: &str = "_etcd-client._tcp.example.com";

fuzz_target!(|data: &[u8]| {
    let [mode, rest @ ..] = data else {
        return;
    };
    if mode & 1 == 0 {
        parse(rest);
    } else {
        discover(mode & 2 != 0, rest);
    }
});

fn parse(msg: &[u8]) {
    let id = msg
        .get(..2)
        .map_or(0, |id| u16::from_be_bytes([id[0], id[1]]));
    if let Ok(answer) = parse_answer(msg, id, NAME) {
        assert!(answer.rcode < 16);
        if answer.truncated {
            assert!(answer.records.is_empty());
        }
        for record in &answer.records {
            // Letters, digits, '-', '_', dots between labels, and \DDD for any other byte.
            let target = record.target.as_bytes();
            assert!(
                target.len() <= 255 * 4,
                "a name is at most 255 bytes on the wire"
            );
            assert!(!target.starts_with(b".") && !target.ends_with(b"."));
            assert!(
                target
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.\\".contains(b)),
                "{:?}",
                record.target
            );
        }
    }
    let conf = parse_resolv_conf(&String::from_utf8_lossy(msg));
    assert!(!conf.servers.is_empty());
    assert!((1..=5).contains(&conf.attempts));
    assert!(conf.timeout.as_secs() >= 1 && conf.timeout.as_secs() <= 30);
}

fn discover(insecure: bool, mut rest: &[u8]) {
    let mut script = DnsScript::default();
    let mut datagrams_done = false;
    while let [hi, lo, more @ ..] = rest {
        let len = usize::from(u16::from_be_bytes([*hi, *lo])).min(more.len());
        let (message, after) = more.split_at(len);
        rest = after;
        if !datagrams_done && message.is_empty() {
            datagrams_done = true;
        } else if datagrams_done {
            script.tcp_streams.push(message.to_vec());
        } else {
            script.datagrams.push(message.to_vec());
        }
    }
    if let Ok(endpoints) = discover_srv("example.com", insecure, script, 0x1234) {
        assert!(!endpoints.is_empty());
        for (i, endpoint) in endpoints.iter().enumerate() {
            assert!(!endpoints[..i].contains(endpoint), "duplicate {endpoint}");
            assert_eq!(
                endpoint.scheme(),
                endpoints[0].scheme(),
                "one scheme for all"
            );
        }
    }
}
