//! The DNS wire format (RFC 1035 §4), as much of it as an SRV lookup needs: a query for one name of type SRV
//! (RFC 2782), with an EDNS(0) OPT record (RFC 6891) offering answers of up to 1232 bytes over UDP as Go's resolver
//! does, and the SRV records of an answer, compressed names (§4.1.4) included.
//!
//! Every read is bounds-checked: a malformed answer is an error, never a panic.

/// Resource record type SRV (RFC 2782).
pub const TYPE_SRV: u16 = 33;
/// Resource record type OPT (EDNS(0), RFC 6891).
const TYPE_OPT: u16 = 41;
/// Class IN.
const CLASS_IN: u16 = 1;
/// The UDP payload size offered in the OPT record: the DNS flag day 2020 value, Go's resolver's too.
pub const UDP_PAYLOAD: u16 = 1232;

/// Response codes (RFC 1035 §4.1.1) the lookup tells apart.
pub const RCODE_NO_ERROR: u8 = 0;
pub const RCODE_SERVER_FAILURE: u8 = 2;
pub const RCODE_NAME_ERROR: u8 = 3;

/// Header flag bits.
const FLAG_RESPONSE: u16 = 0x8000;
const FLAG_TRUNCATED: u16 = 0x0200;
const FLAG_RECURSION_DESIRED: u16 = 0x0100;

/// Longest name on the wire, length bytes included (RFC 1035 §2.3.4).
const MAX_NAME: usize = 255;
/// Longest label.
const MAX_LABEL: usize = 63;

/// One SRV record's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// The target host without the trailing dot; empty for `.`, which says the service is not offered there
    /// (RFC 2782). Bytes other than letters, digits, `-` and `_` are written `\DDD`, as Go writes them.
    pub target: String,
}

/// What an answer to our query says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code (the low 4 bits; extended codes are not asked for).
    pub rcode: u8,
    /// The TC bit: the answer did not fit and must be asked again over TCP (then `records` is empty).
    pub truncated: bool,
    /// The SRV records of class IN in the answer section, in the order given.
    pub records: Vec<Srv>,
}

/// Why an answer could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message ends early (byte {0})")]
    Short(usize),
    #[error("malformed name at byte {0}")]
    BadName(usize),
    #[error("not an answer to the query sent")]
    NotOurs,
}

/// Checks that `name` can be asked for: labels of 1 to 63 letters, digits, `-` or `_`, at most 255 bytes on the
/// wire; a trailing dot is allowed.
pub fn check_name(name: &str) -> Result<(), String> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return Err("the domain name is empty".into());
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!("label {label:?} is longer than {MAX_LABEL} bytes"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
        {
            return Err(format!(
                "{c:?} in label {label:?} (letters, digits, '-' and '_' only)"
            ));
        }
    }
    if trimmed.len() + 2 > MAX_NAME {
        return Err(format!("longer than {MAX_NAME} bytes on the wire"));
    }
    Ok(())
}

/// A query with ID `id` for the SRV records of `name` (checked by [`check_name`]), asking for recursion.
pub fn query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    check_name(name)?;
    let mut out = Vec::with_capacity(12 + name.len() + 2 + 4 + 11);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&FLAG_RECURSION_DESIRED.to_be_bytes());
    for count in [1u16, 0, 0, 1] {
        out.extend_from_slice(&count.to_be_bytes());
    }
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    for label in trimmed.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out.extend_from_slice(&TYPE_SRV.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    // OPT: root name, type, the UDP payload size as its class, extended RCODE and flags 0, no options.
    out.push(0);
    out.extend_from_slice(&TYPE_OPT.to_be_bytes());
    out.extend_from_slice(&UDP_PAYLOAD.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    Ok(out)
}

/// Reads `msg` as the answer to the query [`query`]`(id, name)` made: its ID, the response bit and its question
/// must match ([`WireError::NotOurs`] otherwise, so that a stray datagram is skipped).
pub fn parse_answer(msg: &[u8], id: u16, name: &str) -> Result<Answer, WireError> {
    let mut r = Reader { msg, pos: 0 };
    let got_id = r.u16()?;
    let flags = r.u16()?;
    let questions = r.u16()?;
    let answers = r.u16()?;
    let _authority = r.u16()?;
    let _additional = r.u16()?;
    if got_id != id || flags & FLAG_RESPONSE == 0 || (flags >> 11) & 0xf != 0 || questions != 1 {
        return Err(WireError::NotOurs);
    }
    let asked = r.name()?;
    let (qtype, qclass) = (r.u16()?, r.u16()?);
    let wanted = name.strip_suffix('.').unwrap_or(name);
    if !asked.eq_ignore_ascii_case(wanted) || qtype != TYPE_SRV || qclass != CLASS_IN {
        return Err(WireError::NotOurs);
    }
    let rcode = (flags & 0xf) as u8;
    if flags & FLAG_TRUNCATED != 0 {
        return Ok(Answer {
            rcode,
            truncated: true,
            records: Vec::new(),
        });
    }
    let mut records = Vec::new();
    for _ in 0..answers {
        r.skip_name()?;
        let rtype = r.u16()?;
        let class = r.u16()?;
        let _ttl = r.u32()?;
        let len = usize::from(r.u16()?);
        let start = r.pos;
        let end = start + len;
        if end > msg.len() {
            return Err(WireError::Short(msg.len()));
        }
        if rtype == TYPE_SRV && class == CLASS_IN {
            let mut data = Reader {
                msg: &msg[..end],
                pos: start,
            };
            let priority = data.u16()?;
            let weight = data.u16()?;
            let port = data.u16()?;
            let target = data.name()?;
            if data.pos != end {
                return Err(WireError::BadName(start + 6));
            }
            records.push(Srv {
                priority,
                weight,
                port,
                target,
            });
        }
        r.pos = end;
    }
    Ok(Answer {
        rcode,
        truncated: false,
        records,
    })
}

/// The answer a server gives to `query` (made by [`query`]) with `rcode` and `records`, their targets written out
/// in full: for tests of the code above it.
#[cfg(test)]
pub fn encode_answer(query: &[u8], rcode: u8, records: &[Srv]) -> Vec<u8> {
    let question_end = query.len() - 11;
    let mut msg = query[..question_end].to_vec();
    msg[2] = 0x81;
    msg[3] = 0x80 | rcode;
    msg[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    msg[10..12].copy_from_slice(&[0, 0]);
    for record in records {
        let mut data = Vec::new();
        for v in [record.priority, record.weight, record.port] {
            data.extend_from_slice(&v.to_be_bytes());
        }
        for label in record.target.split('.').filter(|l| !l.is_empty()) {
            data.push(label.len() as u8);
            data.extend_from_slice(label.as_bytes());
        }
        data.push(0);
        msg.extend_from_slice(&[0xc0, 12]);
        msg.extend_from_slice(&TYPE_SRV.to_be_bytes());
        msg.extend_from_slice(&CLASS_IN.to_be_bytes());
        msg.extend_from_slice(&60u32.to_be_bytes());
        msg.extend_from_slice(&(data.len() as u16).to_be_bytes());
        msg.extend_from_slice(&data);
    }
    msg
}

/// A cursor over a message. For an SRV record's data `msg` ends where the record does: its target may point back
/// into the message, never past the record.
struct Reader<'a> {
    msg: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self
            .msg
            .get(self.pos..self.pos + N)
            .ok_or(WireError::Short(self.pos))?;
        self.pos += N;
        Ok(bytes.try_into().expect("the slice has N bytes"))
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.bytes().map(u16::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.bytes().map(u32::from_be_bytes)
    }

    /// Reads a name, following compression pointers, and moves past it.
    fn name(&mut self) -> Result<String, WireError> {
        let (name, next) = read_name(self.msg, self.pos)?;
        self.pos = next;
        Ok(name)
    }

    fn skip_name(&mut self) -> Result<(), WireError> {
        self.name().map(drop)
    }
}

/// Reads the name at `start` of `msg`: its text (without the trailing dot; empty for the root) and where the bytes
/// after it begin. A pointer must point before itself, and the name may not exceed 255 bytes, which together
/// bound the reading of any message.
fn read_name(msg: &[u8], start: usize) -> Result<(String, usize), WireError> {
    let mut text = String::new();
    let mut pos = start;
    let mut next = None;
    let mut wire_len = 1;
    loop {
        let len = *msg.get(pos).ok_or(WireError::Short(pos))?;
        match len >> 6 {
            0 if len == 0 => {
                return Ok((text, next.unwrap_or(pos + 1)));
            }
            0 => {
                let len = usize::from(len);
                let label = msg
                    .get(pos + 1..pos + 1 + len)
                    .ok_or(WireError::Short(msg.len()))?;
                wire_len += 1 + len;
                if wire_len > MAX_NAME {
                    return Err(WireError::BadName(start));
                }
                if !text.is_empty() {
                    text.push('.');
                }
                for &b in label {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_') {
                        text.push(char::from(b));
                    } else {
                        text.push_str(&format!("\\{b:03}"));
                    }
                }
                pos += 1 + len;
            }
            3 => {
                let low = *msg.get(pos + 1).ok_or(WireError::Short(pos + 1))?;
                let target = usize::from(len & 0x3f) << 8 | usize::from(low);
                if target >= pos {
                    return Err(WireError::BadName(pos));
                }
                next.get_or_insert(pos + 2);
                pos = target;
            }
            _ => return Err(WireError::BadName(pos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer to `query(7, name)` with `records` (name pointer, then data) and `rcode`.
    fn answer(name: &str, rcode: u8, records: &[&[u8]]) -> Vec<u8> {
        let q = query(7, name).unwrap();
        let question_end = q.len() - 11;
        let mut msg = q[..question_end].to_vec();
        msg[2] = 0x81;
        msg[3] = 0x80 | rcode;
        msg[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        msg[10..12].copy_from_slice(&0u16.to_be_bytes());
        for data in records {
            msg.extend_from_slice(&[0xc0, 12]);
            msg.extend_from_slice(&TYPE_SRV.to_be_bytes());
            msg.extend_from_slice(&CLASS_IN.to_be_bytes());
            msg.extend_from_slice(&60u32.to_be_bytes());
            msg.extend_from_slice(&(data.len() as u16).to_be_bytes());
            msg.extend_from_slice(data);
        }
        msg
    }

    /// SRV data: priority, weight, port, then `target` on the wire as given.
    fn srv(priority: u16, weight: u16, port: u16, target: &[u8]) -> Vec<u8> {
        let mut data = Vec::new();
        for v in [priority, weight, port] {
            data.extend_from_slice(&v.to_be_bytes());
        }
        data.extend_from_slice(target);
        data
    }

    const NAME: &str = "_etcd-client._tcp.example.com";

    #[test]
    fn a_query_is_rfc_1035_with_an_edns_record() {
        let q = query(0x1234, "_a._tcp.b.").unwrap();
        assert_eq!(
            q,
            [
                &[0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1][..],
                b"\x02_a\x04_tcp\x01b\x00",
                &[0, 33, 0, 1],
                &[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0],
            ]
            .concat()
        );
    }

    #[test]
    fn names_that_cannot_be_asked_are_refused() {
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "a b.c",
            "a/b",
            &"x".repeat(64),
            &["abcdefghi"; 26].join("."),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
            assert!(query(1, bad).is_err(), "{bad:?}");
        }
        for good in [
            "example.com",
            "example.com.",
            "_etcd-client-ssl-x._tcp.a-b.c_d",
        ] {
            check_name(good).unwrap();
        }
    }

    #[test]
    fn srv_records_are_read_with_compressed_and_plain_targets() {
        // The second target ends with a pointer to "example.com" in the question.
        let question_suffix = 12 + 1 + "_etcd-client".len() + 1 + "_tcp".len();
        let mut compressed = b"\x02m2".to_vec();
        compressed.extend_from_slice(&[0xc0, question_suffix as u8]);
        let msg = answer(
            NAME,
            0,
            &[
                &srv(10, 5, 2379, b"\x02m1\x07example\x03com\x00"),
                &srv(20, 0, 2380, &compressed),
                &srv(0, 0, 0, b"\x00"),
            ],
        );
        let got = parse_answer(&msg, 7, NAME).unwrap();
        assert_eq!(got.rcode, RCODE_NO_ERROR);
        assert!(!got.truncated);
        let targets: Vec<_> = got
            .records
            .iter()
            .map(|r| (r.priority, r.weight, r.port, r.target.as_str()))
            .collect();
        assert_eq!(
            targets,
            [
                (10, 5, 2379, "m1.example.com"),
                (20, 0, 2380, "m2.example.com"),
                (0, 0, 0, "")
            ]
        );
    }

    #[test]
    fn other_records_are_skipped_and_odd_bytes_escaped() {
        let mut msg = answer(NAME, 0, &[&srv(1, 1, 1, b"\x03a.b\x00")]);
        // A CNAME before the SRV record: skipped.
        let cname = [&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 60, 0, 2][..], &[0xc0, 12]].concat();
        let first_record = answer(NAME, 0, &[]).len();
        msg.splice(first_record..first_record, cname);
        msg[7] = 2;
        let got = parse_answer(&msg, 7, NAME).unwrap();
        assert_eq!(got.records.len(), 1);
        assert_eq!(got.records[0].target, "a\\046b");
    }

    #[test]
    fn rcode_and_truncation_are_reported() {
        let nx = parse_answer(&answer(NAME, 3, &[]), 7, NAME).unwrap();
        assert_eq!((nx.rcode, nx.records.len()), (RCODE_NAME_ERROR, 0));
        let mut tc = answer(NAME, 0, &[&srv(1, 1, 1, b"\x00")]);
        tc[2] |= 0x02;
        tc.truncate(tc.len() - 5);
        let got = parse_answer(&tc, 7, NAME).unwrap();
        assert!(got.truncated && got.records.is_empty());
    }

    #[test]
    fn answers_to_other_queries_are_not_ours() {
        let msg = answer(NAME, 0, &[]);
        assert_eq!(parse_answer(&msg, 8, NAME), Err(WireError::NotOurs));
        assert_eq!(
            parse_answer(&msg, 7, "_etcd-client-ssl._tcp.example.com"),
            Err(WireError::NotOurs)
        );
        assert!(parse_answer(&msg, 7, &NAME.to_uppercase()).is_ok());
        let q = query(7, NAME).unwrap();
        assert_eq!(parse_answer(&q, 7, NAME), Err(WireError::NotOurs));
    }

    #[test]
    fn malformed_answers_are_errors() {
        let good = answer(NAME, 0, &[&srv(1, 1, 1, b"\x01a\x00")]);
        // Every prefix of a good answer is short, never a panic.
        for len in 0..good.len() {
            assert!(parse_answer(&good[..len], 7, NAME).is_err(), "{len}");
        }
        for pointer in [[0xc0, 0xff], [0xff, 0xff]] {
            let forward = answer(NAME, 0, &[&srv(1, 1, 1, &pointer)]);
            assert!(matches!(
                parse_answer(&forward, 7, NAME),
                Err(WireError::BadName(_))
            ));
        }
        let mut to_itself = answer(NAME, 0, &[&srv(1, 1, 1, &[0xc0, 0])]);
        let at = to_itself.len() - 2;
        to_itself[at + 1] = at as u8;
        assert_eq!(
            parse_answer(&to_itself, 7, NAME),
            Err(WireError::BadName(at))
        );
        let reserved_label = answer(NAME, 0, &[&srv(1, 1, 1, &[0x40, 0])]);
        assert!(parse_answer(&reserved_label, 7, NAME).is_err());
        let overlong_data = answer(NAME, 0, &[&srv(1, 1, 1, b"\x01a\x00\x00")]);
        assert!(parse_answer(&overlong_data, 7, NAME).is_err());
        let target_past_rdata = answer(NAME, 0, &[&srv(1, 1, 1, b"\x05a")]);
        assert!(parse_answer(&target_past_rdata, 7, NAME).is_err());
        // A name made of 200 pointers to a label of 60 bytes is longer than 255 bytes.
        let mut chain = answer(NAME, 0, &[]);
        let label = chain.len();
        chain.push(60);
        chain.extend_from_slice(&[b'x'; 60]);
        chain.push(0);
        assert!(read_name(&chain, label).is_ok());
        let mut prev = label;
        for _ in 0..5 {
            let here = chain.len();
            chain.push(60);
            chain.extend_from_slice(&[b'y'; 60]);
            chain.extend_from_slice(&[0xc0 | (prev >> 8) as u8, prev as u8]);
            prev = here;
        }
        assert_eq!(read_name(&chain, prev), Err(WireError::BadName(prev)));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = parse_answer(&bytes, 7, NAME);
        }

        #[test]
        fn damaged_answers_never_panic(
            damage in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 1..6),
        ) {
            let mut msg = answer(NAME, 0, &[&srv(1, 1, 1, b"\x01a\xc0\x0c"), &srv(2, 2, 2, b"\x00")]);
            for (at, byte) in damage {
                let at = at % msg.len();
                msg[at] = byte;
            }
            let _ = parse_answer(&msg, 7, NAME);
        }
    }
}
