//! Whether a new span is recorded: etcd's sampler, OpenTelemetry's ParentBased(TraceIDRatioBased): a span with a
//! parent follows the parent's sampled flag; a root span is recorded for a fraction of trace ids, given in
//! samples per million as etcd's `--distributed-tracing-sampling-rate` gives it.

use super::context::SpanContext;

/// The sampling rate that records every root span.
pub const PER_MILLION: u32 = 1_000_000;

#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    /// Trace ids whose upper 63 bits of their last 8 bytes fall below this are recorded (OpenTelemetry's
    /// TraceIDRatioBased reads the same bits, so the proxy and etcd agree on a root they both see).
    bound: u64,
    /// Rate 1,000,000 records everything, rate 0 nothing.
    always: bool,
}

impl Sampler {
    /// `per_million` samples per million root spans (at most [`PER_MILLION`]).
    pub fn new(per_million: u32) -> Self {
        let fraction = f64::from(per_million.min(PER_MILLION)) / f64::from(PER_MILLION);
        Self {
            bound: (fraction * (1u64 << 63) as f64) as u64,
            always: per_million >= PER_MILLION,
        }
    }

    /// Whether a span of `trace_id` with `parent` (from the caller) is recorded.
    pub fn sampled(&self, parent: Option<&SpanContext>, trace_id: &[u8; 16]) -> bool {
        if let Some(parent) = parent {
            return parent.sampled;
        }
        if self.always {
            return true;
        }
        let low: [u8; 8] = trace_id[8..16].try_into().expect("8 bytes");
        (u64::from_be_bytes(low) >> 1) < self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(last: u64) -> [u8; 16] {
        let mut id = [1u8; 16];
        id[8..].copy_from_slice(&last.to_be_bytes());
        id
    }

    #[test]
    fn a_parent_decides_whatever_the_rate() {
        let parent = |sampled| SpanContext {
            trace_id: trace(1),
            span_id: [1; 8],
            sampled,
        };
        assert!(Sampler::new(0).sampled(Some(&parent(true)), &trace(u64::MAX)));
        assert!(!Sampler::new(PER_MILLION).sampled(Some(&parent(false)), &trace(0)));
    }

    #[test]
    fn root_spans_follow_the_rate_by_trace_id() {
        assert!(!Sampler::new(0).sampled(None, &trace(0)));
        assert!(Sampler::new(PER_MILLION).sampled(None, &trace(u64::MAX)));
        let half = Sampler::new(PER_MILLION / 2);
        assert!(half.sampled(None, &trace(0)));
        assert!(half.sampled(None, &trace(u64::MAX / 2 - 2)));
        assert!(!half.sampled(None, &trace(u64::MAX)));
    }
}
