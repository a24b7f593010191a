//! One JSON line per event, as etcd's zap logger writes it (`logutil.DefaultZapLoggerConfig`): `level`, `ts`,
//! `caller`, `msg` first, then the event's fields in the order they were given, so that one log pipeline reads
//! etcd and this proxy alike.
//!
//! - `level`: zap's lowercase names (`debug`, `info`, `warn`, `error`); zap has no trace level, so tracing's
//!   `TRACE` is written as `debug`.
//! - `ts`: UTC with microseconds, `2006-01-02T15:04:05.000000Z` (etcd's format, which keeps capnslog's precision).
//! - `caller`: zap's short caller, the file's directory and name and the line (`server/call_log.rs:31`); left out
//!   when the event has no location, as zap leaves it out.
//! - fields: integers, floats and booleans as JSON values, everything else as a string; strings escaped as zap
//!   escapes them (`"`, `\`, control characters; nothing else).

use std::fmt::{self, Write as _};

use time::OffsetDateTime;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of the proxy's log lines.
pub struct ZapJson {
    /// Where `ts` comes from: the wall clock in production (a log line says when it was written, for operators; only
    /// `main` installs this formatter, never the simulation), a fixed instant in tests.
    now: fn() -> OffsetDateTime,
}

impl ZapJson {
    pub fn new() -> Self {
        Self {
            now: OffsetDateTime::now_utc,
        }
    }

    /// A formatter whose `ts` is always what `now` says (for tests).
    pub fn with_clock(now: fn() -> OffsetDateTime) -> Self {
        Self { now }
    }
}

impl Default for ZapJson {
    fn default() -> Self {
        Self::new()
    }
}

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // A record of the `log` crate carries its level, file and line as fields: read them as metadata instead.
        let normalized = event.normalized_metadata();
        let mut fields = Fields {
            from_log_crate: normalized.is_some(),
            ..Fields::default()
        };
        event.record(&mut fields);
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut line = String::with_capacity(128 + fields.rest.len());
        line.push_str("{\"level\":\"");
        line.push_str(level_name(*meta.level()));
        line.push_str("\",\"ts\":\"");
        push_timestamp(&mut line, (self.now)());
        line.push('"');
        if let (Some(file), Some(number)) = (meta.file(), meta.line()) {
            line.push_str(",\"caller\":");
            push_json_string(&mut line, &format!("{}:{number}", short_path(file)));
        }
        line.push_str(",\"msg\":");
        push_json_string(&mut line, &fields.message);
        line.push_str(&fields.rest);
        line.push('}');
        writeln!(writer, "{line}")
    }
}

/// zap's name of a level.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// zap's short caller: the last directory and the file name.
fn short_path(file: &str) -> &str {
    match file.rfind('/') {
        Some(last) => match file[..last].rfind('/') {
            Some(before) => &file[before + 1..],
            None => file,
        },
        None => file,
    }
}

/// `2006-01-02T15:04:05.000000Z`, in UTC.
fn push_timestamp(line: &mut String, at: OffsetDateTime) {
    let at = at.to_offset(time::UtcOffset::UTC);
    let _ = write!(
        line,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.microsecond()
    );
}

/// `value` as a JSON string, escaped as zap escapes it.
fn push_json_string(line: &mut String, value: &str) {
    line.push('"');
    for c in value.chars() {
        match c {
            '"' => line.push_str("\\\""),
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(line, "\\u{:04x}", c as u32);
            }
            c => line.push(c),
        }
    }
    line.push('"');
}

/// An event's message, and its other fields already written as `,"name":value` in the order given.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    /// The event is a record of the `log` crate, whose `log.*` fields are its metadata, not fields to write.
    from_log_crate: bool,
}

impl Fields {
    fn skipped(&self, field: &Field) -> bool {
        self.from_log_crate && field.name().starts_with("log.")
    }

    fn key(&mut self, field: &Field) {
        self.rest.push(',');
        push_json_string(&mut self.rest, field.name());
        self.rest.push(':');
    }

    fn raw(&mut self, field: &Field, value: impl fmt::Display) {
        if self.skipped(field) {
            return;
        }
        self.key(field);
        let _ = write!(self.rest, "{value}");
    }

    fn string(&mut self, field: &Field, value: &str) {
        if self.skipped(field) {
            return;
        }
        self.key(field);
        push_json_string(&mut self.rest, value);
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.string(field, &text);
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.string(field, value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field, value);
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.raw(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.raw(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field, value);
    }

    /// Finite floats as numbers; zap writes NaN and the infinities as the strings "NaN", "+Inf", "-Inf".
    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.raw(field, value);
        } else if value.is_nan() {
            self.string(field, "NaN");
        } else if value > 0.0 {
            self.string(field, "+Inf");
        } else {
            self.string(field, "-Inf");
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.string(field, &value.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// 2026-03-04T05:06:07.000089Z
    fn fixed() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(1_772_600_767_000_089_999).unwrap()
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `emit` logs (at every level) through the formatter.
    fn lines(emit: impl FnOnce()) -> Vec<String> {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .event_format(ZapJson::with_clock(fixed))
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_line_is_level_ts_caller_msg_then_the_fields_in_order() {
        let mut line = 0;
        let got = lines(|| {
            line = line!() + 1;
            tracing::info!(
                address = "127.0.0.1:23790",
                zeta = 1u64,
                alpha = true,
                "started gRPC proxy"
            );
        });
        assert_eq!(
            got,
            [format!(
                "{{\"level\":\"info\",\"ts\":\"2026-03-04T05:06:07.000089Z\",\"caller\":\"logging/zap_json.rs:{line}\",\
                 \"msg\":\"started gRPC proxy\",\"address\":\"127.0.0.1:23790\",\"zeta\":1,\"alpha\":true}}"
            )]
        );
    }

    #[test]
    fn levels_have_zaps_names() {
        let got = lines(|| {
            tracing::error!("e");
            tracing::warn!("w");
            tracing::info!("i");
            tracing::debug!("d");
            tracing::trace!("t");
        });
        let levels: Vec<String> = got
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["level"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(levels, ["error", "warn", "info", "debug", "debug"]);
    }

    #[test]
    fn values_are_json_numbers_booleans_or_strings() {
        let err = std::io::Error::other("permission denied");
        let got = lines(|| {
            tracing::warn!(
                n = -3i64,
                big = 340282366920938463463374607431768211455u128,
                ms = 1.25f64,
                nan = f64::NAN,
                inf = f64::INFINITY,
                shown = %"display",
                debugged = ?Some(1),
                error = &err as &(dyn std::error::Error + 'static),
                "cannot register in etcd; trying again"
            );
        });
        let v: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(v["n"], -3);
        assert!(
            got[0].contains(",\"big\":340282366920938463463374607431768211455,"),
            "{}",
            got[0]
        );
        assert_eq!(v["ms"], 1.25);
        assert_eq!(v["nan"], "NaN");
        assert_eq!(v["inf"], "+Inf");
        assert_eq!(v["shown"], "display");
        assert_eq!(v["debugged"], "Some(1)");
        assert_eq!(v["error"], "permission denied");
        assert_eq!(v["msg"], "cannot register in etcd; trying again");
    }

    #[test]
    fn strings_are_escaped_as_zap_escapes_them() {
        let got = lines(|| {
            tracing::info!(
                key = "quote\" backslash\\ nl\n cr\r tab\t bell\u{7} <&> é",
                "a \"message\"\n"
            );
        });
        let line = &got[0];
        assert!(
            line.ends_with(
                "\"msg\":\"a \\\"message\\\"\\n\",\
                 \"key\":\"quote\\\" backslash\\\\ nl\\n cr\\r tab\\t bell\\u0007 <&> é\"}"
            ),
            "{line}"
        );
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["msg"], "a \"message\"\n");
    }

    #[test]
    fn records_of_the_log_crate_have_their_own_level_and_caller_and_no_log_fields() {
        let got = lines(|| {
            let record = log::Record::builder()
                .level(log::Level::Warn)
                .target("rustls::conn")
                .file(Some("/registry/rustls-0.23.0/src/conn/mod.rs"))
                .line(Some(42))
                .args(format_args!("peer sent \"close_notify\""))
                .build();
            tracing_log::format_trace(&record).unwrap();
        });
        assert_eq!(
            got,
            [
                "{\"level\":\"warn\",\"ts\":\"2026-03-04T05:06:07.000089Z\",\"caller\":\"conn/mod.rs:42\",\
                 \"msg\":\"peer sent \\\"close_notify\\\"\"}"
            ]
        );
    }

    #[test]
    fn callers_are_the_last_directory_and_the_file() {
        assert_eq!(
            short_path("proxy/src/server/call_log.rs"),
            "server/call_log.rs"
        );
        assert_eq!(
            short_path("/root/.cargo/registry/src/h2-0.4.0/src/proto/connection.rs"),
            "proto/connection.rs"
        );
        assert_eq!(short_path("src/main.rs"), "src/main.rs");
        assert_eq!(short_path("main.rs"), "main.rs");
    }
}
