//! The seeded property runner every arbitrary-input and model property uses: reproducible in `cargo test` (seed 0),
//! varied by `ci/fuzz.sh` (`FUZZ_SEED`, `FUZZ_CASES`), and a failure names the seed and cases to rerun with.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

/// Runs `test` on `FUZZ_CASES` (default `default_cases`) values of `strategy`, drawn from seed `FUZZ_SEED`
/// (default 0); panics with the minimal failing value and how to rerun it.
pub fn check<S: Strategy>(
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let from_env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse().ok());
    let seed: u64 = from_env("FUZZ_SEED").unwrap_or(0);
    let cases = from_env("FUZZ_CASES").map_or(default_cases, |n: u64| n as u32);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    if let Err(failure) = runner.run(&strategy, test) {
        panic!("{failure}\nrerun with FUZZ_SEED={seed} FUZZ_CASES={cases}");
    }
}
