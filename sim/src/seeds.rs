//! Which seeds a test run sweeps: `SIM_SEED=n` runs exactly seed n; `SIM_SEEDS=n` sweeps n seeds from
//! `SIM_SEED_START` (default 0), so that a sweep can cover seeds no earlier sweep (and no fix) saw; otherwise
//! [`DEFAULT_SEEDS`] from 0. Seeds that once failed live in `testdata/sim/regressions.txt` (`scenario seed # why`) and
//! run every time.

/// Seeds per scenario in a default `cargo test -p sim`.
pub const DEFAULT_SEEDS: u64 = 64;

/// The seeds to sweep, from the environment.
pub fn sweep() -> Vec<u64> {
    sweep_or(DEFAULT_SEEDS)
}

/// [`sweep`] with another default count, for a sweep that costs more per seed (the TLS one).
pub fn sweep_or(default: u64) -> Vec<u64> {
    if let Some(seed) = env_u64("SIM_SEED") {
        return vec![seed];
    }
    let count = env_u64("SIM_SEEDS").unwrap_or(default);
    let start = env_u64("SIM_SEED_START").unwrap_or(0);
    (start..start + count).collect()
}

fn env_u64(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => panic!("{name}={raw:?} is not a number"),
    }
}

/// The regression seeds of `scenario` listed in `text` (the contents of `testdata/sim/regressions.txt`).
pub fn regressions(text: &str, scenario: &str) -> Vec<u64> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            let seed = fields.next()?.parse().ok()?;
            (name == scenario).then_some(seed)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_lines_name_a_scenario_and_a_seed() {
        let text = "# comment\nwatch 17 # dropped event on failover\nlease 3\n\nwatch x\nwatch 4\n";
        assert_eq!(regressions(text, "watch"), [17, 4]);
        assert_eq!(regressions(text, "lease"), [3]);
        assert!(regressions(text, "failover").is_empty());
    }
}
