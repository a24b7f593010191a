//! Invariant checkers, run against the model's history and the clients' logs at the end of every simulation.
//! Each is a pure function, tested on deliberately broken histories (see `tests/checkers.rs`).

pub mod auth;
pub mod cache;
pub mod calls;
pub mod census;
pub mod hygiene;
pub mod lease;
pub mod namespace;
pub mod watch;
