//! Reading the proxy's Prometheus text exposition.

/// The value of the sample `name{labels}` (labels in any order; `name` alone for none).
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, val) = line.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let have: Vec<(&str, &str)> = if rest.is_empty() {
                Vec::new()
            } else {
                rest.split(',')
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.trim(), v.trim().trim_matches('"')))
                    })
                    .collect()
            };
            let matches =
                have.len() == labels.len() && labels.iter().all(|want| have.contains(want));
            if matches { val.parse().ok() } else { None }
        })
}

/// The endpoint whose `etcd_grpc_proxy_upstream_active{endpoint=..}` is 1, if exactly one is.
pub fn active_endpoint(text: &str) -> Option<String> {
    let active: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("etcd_grpc_proxy_upstream_active{endpoint=\""))
        .filter_map(|rest| {
            let (ep, val) = rest.split_once("\"}")?;
            (val.trim().parse::<f64>().ok()? == 1.0).then(|| ep.to_string())
        })
        .collect();
    match active.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

/// `etcd_grpc_proxy_upstream_up{endpoint=E}`: Some(true) when 1, Some(false) when 0.
pub fn upstream_up(text: &str, endpoint: &str) -> Option<bool> {
    value(
        text,
        "etcd_grpc_proxy_upstream_up",
        &[("endpoint", endpoint)],
    )
    .map(|v| v == 1.0)
}

/// `etcd_grpc_proxy_upstream_failovers_total` (0 when absent).
pub fn failovers(text: &str) -> f64 {
    value(text, "etcd_grpc_proxy_upstream_failovers_total", &[]).unwrap_or(0.0)
}
