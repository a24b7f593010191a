//! The proxy's log: `--log-level`, `--debug` and `--log-outputs` (with the values etcd takes), and lines in the
//! JSON of etcd's zap logger ([`zap_json`]) written to every output ([`outputs`]).
//!
//! etcd's Go proxy has `--debug` only and logs JSON to stderr; `--log-level` and `--log-outputs` are the flags of
//! etcd's server, taken with its values so that one deployment configures both alike. `RUST_LOG`, when set,
//! replaces the level with a per-module filter (e.g. `RUST_LOG=grpc=off` silences the call log).

pub mod outputs;
pub mod zap_json;

pub use outputs::LogOutputs;

/// How much is logged: zap's levels, from `--log-level` (or `--debug`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    /// `dpanic`, `panic` and `fatal`: levels above error, at which the proxy (which never panics on purpose nor
    /// logs fatally) writes nothing.
    AboveError,
}

impl LogLevel {
    /// A level as zap reads it (`debug` or `DEBUG`, ...; the empty value is `info`), with etcd's error otherwise.
    pub fn parse(value: &str) -> Result<Self, String> {
        Ok(match value {
            "debug" | "DEBUG" => Self::Debug,
            "info" | "INFO" | "" => Self::Info,
            "warn" | "WARN" => Self::Warn,
            "error" | "ERROR" => Self::Error,
            "dpanic" | "DPANIC" | "panic" | "PANIC" | "fatal" | "FATAL" => Self::AboveError,
            _ => {
                return Err(format!(
                    "--log-level: unrecognized level: {value:?} (supports debug, info, warn, error, panic, or fatal)"
                ));
            }
        })
    }

    /// The filter directive of this level.
    fn directive(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
            Self::AboveError => "off",
        }
    }
}

/// Installs the proxy's logger for the whole process: zap's JSON lines at `level` (unless `RUST_LOG` says
/// otherwise) to `outputs`.
pub fn init(level: LogLevel, outputs: LogOutputs) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.directive()));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .event_format(zap_json::ZapJson::new())
        .with_writer(outputs)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_zaps_in_either_case_and_empty_is_info() {
        for (value, level) in [
            ("debug", LogLevel::Debug),
            ("DEBUG", LogLevel::Debug),
            ("info", LogLevel::Info),
            ("", LogLevel::Info),
            ("WARN", LogLevel::Warn),
            ("error", LogLevel::Error),
            ("dpanic", LogLevel::AboveError),
            ("panic", LogLevel::AboveError),
            ("FATAL", LogLevel::AboveError),
        ] {
            assert_eq!(LogLevel::parse(value), Ok(level), "{value:?}");
        }
    }

    #[test]
    fn other_levels_are_refused_in_zaps_words() {
        for value in ["Debug", "warning", "trace", "verbose"] {
            let err = LogLevel::parse(value).unwrap_err();
            assert!(
                err.starts_with(&format!("--log-level: unrecognized level: \"{value}\"")),
                "{err}"
            );
        }
    }
}
