//! The harness of `tests/namespace.rs`: [`case`] (what a case is, and the requests it makes), [`answers`] (what
//! comes back and how it is compared), [`run`] (one case in one simulated world, judged).

pub mod answers;
pub mod case;
pub mod run;
