//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` header a span's context travels
//! in, read as the spec says a receiver must (anything malformed is ignored, as if there were no header) and
//! written in version 00.

use std::fmt::Write as _;

/// The trace flag that says the caller records the trace.
const SAMPLED: u8 = 0x01;

/// Which span a call belongs to, and whether its trace is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl SpanContext {
    /// Reads a `traceparent` value; `None` when the spec says to ignore it: a version that is not two lowercase
    /// hex digits or is `ff`, a field of the wrong length or not lowercase hex, an all-zero trace or span id, a
    /// version 00 value with anything after the flags, or a later version whose extra fields do not start with `-`.
    pub fn parse(traceparent: &str) -> Option<Self> {
        let raw = traceparent.trim();
        let bytes = raw.as_bytes();
        // version(2) - trace-id(32) - parent-id(16) - flags(2)
        const LEN: usize = 55;
        if bytes.len() < LEN {
            return None;
        }
        let version = hex_byte(&raw[0..2])?;
        if version == 0xff {
            return None;
        }
        match (version, bytes.len()) {
            (0, LEN) => {}
            (0, _) => return None,
            // A later version may append fields: what the receiver knows is read, the rest is left alone.
            (_, LEN) => {}
            (_, _) if bytes[LEN] == b'-' => {}
            _ => return None,
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id: [u8; 16] = hex(&raw[3..35])?.try_into().ok()?;
        let span_id: [u8; 8] = hex(&raw[36..52])?.try_into().ok()?;
        let flags = hex_byte(&raw[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & SAMPLED != 0,
        })
    }

    /// The `traceparent` value naming this span (version 00).
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            u8::from(self.sampled) * SAMPLED
        )
    }
}

/// Lowercase hex, as the spec writes every field.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| hex_byte(&text[i..i + 2]))
        .collect()
}

/// Two lowercase hex digits (the spec allows no uppercase).
fn hex_byte(pair: &str) -> Option<u8> {
    if !pair
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u8::from_str_radix(pair, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn a_valid_traceparent_is_read_and_written_back_the_same() {
        let raw = format!("00-{TRACE}-{SPAN}-01");
        let context = SpanContext::parse(&raw).expect("valid");
        assert_eq!(to_hex(&context.trace_id), TRACE);
        assert_eq!(to_hex(&context.span_id), SPAN);
        assert!(context.sampled);
        assert_eq!(context.traceparent(), raw);
        let unsampled = SpanContext::parse(&format!("00-{TRACE}-{SPAN}-00")).unwrap();
        assert!(!unsampled.sampled);
        // Other flag bits do not make a trace sampled.
        assert!(
            !SpanContext::parse(&format!("00-{TRACE}-{SPAN}-02"))
                .unwrap()
                .sampled
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored_as_the_spec_says() {
        for bad in [
            String::new(),
            format!("ff-{TRACE}-{SPAN}-01"), // version ff is invalid
            format!("0g-{TRACE}-{SPAN}-01"), // version not hex
            format!("00-{}-{SPAN}-01", "0".repeat(32)), // all-zero trace id
            format!("00-{TRACE}-{}-01", "0".repeat(16)), // all-zero span id
            format!("00-{}-{SPAN}-01", &TRACE[..31]), // short trace id
            format!("00-{TRACE}-{}-01", &SPAN[..15]), // short span id
            format!("00-{TRACE}-{SPAN}-1"),  // short flags
            format!("00-{TRACE}-{SPAN}-01-extra"), // version 00 has exactly four fields
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()), // uppercase hex
            format!("00_{TRACE}_{SPAN}_01"), // wrong separators
            format!("01-{TRACE}-{SPAN}-01x"), // a later version's extra must start with '-'
        ] {
            assert_eq!(SpanContext::parse(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_for_the_fields_version_00_has() {
        let context = SpanContext::parse(&format!("01-{TRACE}-{SPAN}-01-whatever")).unwrap();
        assert_eq!(to_hex(&context.span_id), SPAN);
        assert!(SpanContext::parse(&format!("cc-{TRACE}-{SPAN}-00")).is_some());
    }
}
