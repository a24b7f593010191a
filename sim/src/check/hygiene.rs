//! Liveness and hygiene: the simulation finished (no panic, no hang) and the proxy stopped cleanly when told to,
//! leaving no task running.

use crate::world::Finished;

pub fn check_hygiene(finished: &Finished) -> Vec<String> {
    let mut violations = Vec::new();
    if let Some(error) = &finished.sim_error {
        violations.push(format!("the simulation failed: {error}"));
    }
    match finished.proxy_exits.last() {
        None if finished.sim_error.is_none() => {
            violations.push("the proxy never reported its exit".to_string())
        }
        None => {}
        Some(exit) => {
            if let Err(error) = &exit.result {
                violations.push(format!("the proxy stopped with an error: {error}"));
            }
            if exit.tasks_left > 0 {
                violations.push(format!(
                    "{} task(s) still running on the proxy host after it stopped",
                    exit.tasks_left
                ));
            }
        }
    }
    violations
}
