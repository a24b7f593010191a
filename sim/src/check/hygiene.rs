//! Liveness and hygiene: the simulation finished (no panic, no hang) and the proxy (every proxy, in a world with
//! several) stopped cleanly when told to, leaving no task running.

use crate::world::Finished;

pub fn check_hygiene(finished: &Finished) -> Vec<String> {
    let mut violations = Vec::new();
    if let Some(error) = &finished.sim_error {
        violations.push(format!("the simulation failed: {error}"));
    }
    if finished.proxy_exits.is_empty() && finished.sim_error.is_none() {
        violations.push("the proxy never reported its exit".to_string());
    }
    // One exit per proxy host (a world may run several).
    for exit in &finished.proxy_exits {
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
    violations
}
