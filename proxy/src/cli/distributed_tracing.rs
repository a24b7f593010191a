//! etcd's distributed-tracing flags, spelled as etcd 3.6+ spells them (`--enable-distributed-tracing`, ...), with
//! etcd 3.5's `--experimental-...` spellings accepted as deprecated aliases, as etcd 3.6 accepts them: an alias
//! given on the command line wins over the new spelling, and is warned about.

use clap::Args;

use crate::config::{Config, Endpoint, Scheme};
use crate::otel::sampler::PER_MILLION;
use crate::otel::{DEFAULT_ADDRESS, DEFAULT_SERVICE_NAME, Settings};

#[derive(Args, Debug)]
pub struct TracingArgs {
    /// Export the proxy's own spans (OpenTelemetry, OTLP over gRPC), as etcd's flag of that name does
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    enable_distributed_tracing: Option<bool>,
    /// Collector address (host:port) for --enable-distributed-tracing [default: localhost:4317]
    #[arg(long)]
    distributed_tracing_address: Option<String>,
    /// Service name of the proxy's spans [default: etcd]
    #[arg(long)]
    distributed_tracing_service_name: Option<String>,
    /// Service instance id of the proxy's spans (unique per proxy; none by default)
    #[arg(long)]
    distributed_tracing_instance_id: Option<String>,
    /// Root spans recorded per million (a sampled parent's span is always recorded) [default: 0]
    #[arg(long)]
    distributed_tracing_sampling_rate: Option<i64>,
    /// Deprecated: use --enable-distributed-tracing
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    experimental_enable_distributed_tracing: Option<bool>,
    /// Deprecated: use --distributed-tracing-address
    #[arg(long)]
    experimental_distributed_tracing_address: Option<String>,
    /// Deprecated: use --distributed-tracing-service-name
    #[arg(long)]
    experimental_distributed_tracing_service_name: Option<String>,
    /// Deprecated: use --distributed-tracing-instance-id
    #[arg(long)]
    experimental_distributed_tracing_instance_id: Option<String>,
    /// Deprecated: use --distributed-tracing-sampling-rate
    #[arg(long)]
    experimental_distributed_tracing_sampling_rate: Option<i64>,
}

/// The value of a flag given in either spelling (the deprecated one wins, as in etcd 3.6), noting the deprecation.
fn either<T>(new: Option<T>, old: Option<T>, name: &str, warnings: &mut Vec<String>) -> Option<T> {
    if old.is_some() {
        warnings.push(format!(
            "--experimental-{name} is deprecated (as in etcd 3.6, removed in 3.7); use --{name}"
        ));
        return old;
    }
    new
}

/// Puts the tracing settings in `config` (`None` when tracing is off); returns the deprecation warnings to log.
/// `epoch_unix_nanos` is the wall clock now, the start of span times.
pub fn apply(
    args: TracingArgs,
    config: &mut Config,
    epoch_unix_nanos: u64,
) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    let w = &mut warnings;
    let enabled = either(
        args.enable_distributed_tracing,
        args.experimental_enable_distributed_tracing,
        "enable-distributed-tracing",
        w,
    );
    let address = either(
        args.distributed_tracing_address,
        args.experimental_distributed_tracing_address,
        "distributed-tracing-address",
        w,
    );
    let service_name = either(
        args.distributed_tracing_service_name,
        args.experimental_distributed_tracing_service_name,
        "distributed-tracing-service-name",
        w,
    );
    let instance_id = either(
        args.distributed_tracing_instance_id,
        args.experimental_distributed_tracing_instance_id,
        "distributed-tracing-instance-id",
        w,
    );
    let rate = either(
        args.distributed_tracing_sampling_rate,
        args.experimental_distributed_tracing_sampling_rate,
        "distributed-tracing-sampling-rate",
        w,
    );
    if enabled != Some(true) {
        config.distributed_tracing = None;
        return Ok(warnings);
    }
    // etcd's checks and words (validated only when tracing is on, as etcd does).
    let rate = rate.unwrap_or(0);
    let invalid = |why: &str| format!("distributed tracing configurition is not valid: ({why})");
    if rate < 0 {
        return Err(invalid("tracing sampling rate must be positive"));
    }
    if rate > i64::from(PER_MILLION) {
        return Err(invalid(&format!(
            "tracing sampling rate must be less than {PER_MILLION}"
        )));
    }
    let address = address.unwrap_or_else(|| DEFAULT_ADDRESS.to_owned());
    let collector =
        Endpoint::parse(&address).map_err(|e| format!("--distributed-tracing-address: {e}"))?;
    if collector.scheme() == Scheme::Https {
        // etcd dials its collector in plaintext too (otlptracegrpc.WithInsecure).
        return Err(format!(
            "--distributed-tracing-address {address:?}: the collector is reached in plaintext (host:port)"
        ));
    }
    config.distributed_tracing = Some(Settings {
        address: collector.authority().to_owned(),
        service_name: service_name.unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
        instance_id: instance_id.unwrap_or_default(),
        sampling_per_million: u32::try_from(rate).expect("checked above"),
        epoch_unix_nanos,
    });
    Ok(warnings)
}
