//! The metric names a PromQL expression reads, and whether a Prometheus exposition exports them.
//!
//! Not a PromQL parser: a tokenizer that knows just enough of the grammar to tell a metric name from everything
//! else that looks like an identifier: function and aggregation names (followed by `(`), label names (inside
//! `{...}`, `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_left/right (...)`, and the label
//! argument of Grafana's `label_values(expr, label)`), keywords (`and`, `bool`, `offset`, ...), strings, numbers,
//! durations (`[5m]`, `offset 1h`) and Grafana variables (`$job`, `${job}`, `$__rate_interval`).

use std::collections::{BTreeMap, BTreeSet};

/// Words that are never metric names where they stand alone.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
];

/// Words whose parenthesised list that follows holds label names, not expressions.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// What an open parenthesis encloses.
#[derive(Clone, Copy, PartialEq)]
enum Paren {
    /// An expression: a call's arguments or a group.
    Expression,
    /// Label names (`by (...)` and its kin).
    Labels,
    /// Grafana's `label_values(expr, label)`: an expression, then after the comma a label name.
    LabelValues { after_comma: bool },
}

/// Every metric name `expr` reads, or why it could not be read (unbalanced brackets, an unterminated string).
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut parens: Vec<Paren> = Vec::new();
    // Set by a label-list keyword: the next `(` opens label names.
    let mut labels_next = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '"' | '\'' | '`' => i = skip_string(&chars, i)?,
            '{' => i = skip_braces(&chars, i)?,
            '[' => {
                let close = find(&chars, i + 1, ']')
                    .ok_or_else(|| format!("unclosed `[` at {i} in {expr:?}"))?;
                i = close + 1;
            }
            '$' => i = skip_variable(&chars, i)?,
            '#' => {
                // A comment runs to the end of the line.
                i = find(&chars, i, '\n').map_or(chars.len(), |n| n + 1);
            }
            '(' => {
                parens.push(if labels_next {
                    Paren::Labels
                } else {
                    Paren::Expression
                });
                labels_next = false;
                i += 1;
            }
            ')' => {
                parens
                    .pop()
                    .ok_or_else(|| format!("unopened `)` at {i} in {expr:?}"))?;
                i += 1;
            }
            ',' => {
                if let Some(Paren::LabelValues { after_comma }) = parens.last_mut() {
                    *after_comma = true;
                }
                i += 1;
            }
            c if c.is_ascii_digit() || (c == '.' && next_is_digit(&chars, i)) => {
                i = skip_number(&chars, i);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                // An aggregation may put its `by (...)` between its name and its `(`.
                let called = next_non_space(&chars, i) == Some('(')
                    || matches!(next_word(&chars, i).as_str(), "by" | "without");
                let lower = word.to_ascii_lowercase();
                if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                    labels_next = called;
                } else if called {
                    if word == "label_values" {
                        parens.push(Paren::LabelValues { after_comma: false });
                        // Consume the `(` here so that it is not pushed again.
                        i = next_non_space_index(&chars, i) + 1;
                    }
                } else {
                    let is_label = matches!(
                        parens.last(),
                        Some(Paren::Labels | Paren::LabelValues { after_comma: true })
                    );
                    if !is_label && !KEYWORDS.contains(&lower.as_str()) {
                        names.insert(word);
                    }
                }
            }
            // Operators: + - * / % ^ == != < > <= >= =~ !~ @ and the like.
            _ => i += 1,
        }
    }
    if !parens.is_empty() {
        return Err(format!("{} unclosed `(` in {expr:?}", parens.len()));
    }
    Ok(names)
}

/// The families a Prometheus text exposition declares (`# TYPE name type`), with their types: a family with no
/// sample yet still counts.
pub fn exported_families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut parts = rest.split_whitespace();
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

/// The names among `used` that `exported` does not serve: a name is served when it is a family, or a histogram's
/// `_bucket`, `_sum` or `_count` series, or a summary's `_sum` or `_count` series.
pub fn not_exported<'a>(
    used: impl IntoIterator<Item = &'a String>,
    exported: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    used.into_iter()
        .filter(|name| !is_exported(name, exported))
        .cloned()
        .collect()
}

fn is_exported(name: &str, exported: &BTreeMap<String, String>) -> bool {
    if exported.contains_key(name) {
        return true;
    }
    let family_of = |suffix: &str, types: &[&str]| {
        name.strip_suffix(suffix)
            .and_then(|base| exported.get(base))
            .is_some_and(|kind| types.contains(&kind.as_str()))
    };
    family_of("_bucket", &["histogram"])
        || family_of("_sum", &["histogram", "summary"])
        || family_of("_count", &["histogram", "summary"])
}

fn skip_string(chars: &[char], open: usize) -> Result<usize, String> {
    let quote = chars[open];
    let mut i = open + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("unterminated string starting at {open}"))
}

/// Skips a `{...}` label matcher list, strings in it included.
fn skip_braces(chars: &[char], open: usize) -> Result<usize, String> {
    let mut i = open + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i)?,
            '}' => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err(format!("unclosed `{{` at {open}"))
}

/// Skips a Grafana variable: `${name}`, `${name:format}` or `$name`.
fn skip_variable(chars: &[char], dollar: usize) -> Result<usize, String> {
    if chars.get(dollar + 1) == Some(&'{') {
        let close =
            find(chars, dollar + 2, '}').ok_or_else(|| format!("unclosed `${{` at {dollar}"))?;
        return Ok(close + 1);
    }
    let mut i = dollar + 1;
    while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
        i += 1;
    }
    Ok(i)
}

/// Skips a number or a duration: `0.99`, `1e-9`, `0x1f`, `5m`, `1h30m`.
fn skip_number(chars: &[char], start: usize) -> usize {
    let mut i = start;
    while i < chars.len() {
        let c = chars[i];
        let exponent_sign =
            (c == '-' || c == '+') && i > start && matches!(chars[i - 1], 'e' | 'E');
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' || exponent_sign {
            i += 1;
        } else {
            break;
        }
    }
    i
}

fn find(chars: &[char], from: usize, wanted: char) -> Option<usize> {
    (from..chars.len()).find(|&i| chars[i] == wanted)
}

fn next_is_digit(chars: &[char], i: usize) -> bool {
    chars.get(i + 1).is_some_and(|c| c.is_ascii_digit())
}

fn next_non_space_index(chars: &[char], from: usize) -> usize {
    (from..chars.len())
        .find(|&i| !chars[i].is_whitespace())
        .unwrap_or(chars.len())
}

fn next_word(chars: &[char], from: usize) -> String {
    chars[next_non_space_index(chars, from)..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
        .collect::<String>()
        .to_ascii_lowercase()
}

fn next_non_space(chars: &[char], from: usize) -> Option<char> {
    chars.get(next_non_space_index(chars, from)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A PromQL expression built from metric names, label names that could pass for metric names, functions,
    /// aggregations, matchers, ranges and binary operators, with the set of metric names it reads.
    fn expression() -> impl Strategy<Value = (String, BTreeSet<String>)> {
        // PromQL's keywords cannot name a metric.
        let name = "[a-z][a-z_]{0,6}(_total|_bucket)?".prop_filter("a keyword", |name: &String| {
            !KEYWORDS.contains(&name.as_str()) && !LABEL_LIST_KEYWORDS.contains(&name.as_str())
        });
        let label = "[a-z][a-z_]{0,6}";
        let leaf = (name, label, "[a-z ,}{]{0,4}", any::<bool>()).prop_map(
            |(metric, label, value, ranged)| {
                let selector = format!("{metric}{{{label}=~\"{value}\"}}");
                let expr = if ranged {
                    format!("rate({selector}[$__rate_interval])")
                } else {
                    format!("{selector} offset 5m")
                };
                (expr, BTreeSet::from([metric]))
            },
        );
        leaf.prop_recursive(4, 24, 2, move |inner| {
            let labels = prop::collection::vec(label, 1..3).prop_map(|l| l.join(", "));
            prop_oneof![
                (labels.clone(), inner.clone())
                    .prop_map(|(l, (e, n))| (format!("sum by ({l}) ({e})"), n)),
                (labels.clone(), inner.clone())
                    .prop_map(|(l, (e, n))| (format!("max({e}) without ({l})"), n)),
                inner
                    .clone()
                    .prop_map(|(e, n)| (format!("histogram_quantile(0.99, {e})"), n)),
                inner
                    .clone()
                    .prop_map(|(e, n)| (format!("({e}) > bool 1e-3"), n)),
                (inner.clone(), labels, inner).prop_map(|((a, mut n), l, (b, m))| {
                    n.extend(m);
                    (format!("{a} / on ({l}) group_left ({l}) {b}"), n)
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn metric_names_are_exactly_the_selectors_names((expr, names) in expression()) {
            prop_assert_eq!(metric_names(&expr), Ok(names), "{}", expr);
        }
    }

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).unwrap().into_iter().collect()
    }

    #[test]
    fn metric_names_leave_out_functions_labels_keywords_durations_and_variables() {
        let expr = r#"histogram_quantile(0.99, sum by (le, grpc_method) (rate(grpc_server_handling_seconds_bucket{job=~"$job", grpc_type="unary"}[$__rate_interval])))
            / on (instance) group_left (endpoint) max without (endpoint) (etcd_grpc_proxy_upstream_up offset 1h)
            > bool 1e-9 and ${threshold} unless up{job="a,b}"} == 0
            or sum(etcd_grpc_proxy_cache_bytes) by (instance) # a comment naming not_a_metric"#;
        assert_eq!(
            names(expr),
            [
                "etcd_grpc_proxy_cache_bytes",
                "etcd_grpc_proxy_upstream_up",
                "grpc_server_handling_seconds_bucket",
                "up"
            ]
        );
    }

    #[test]
    fn label_values_reads_its_expression_and_not_its_label() {
        assert_eq!(
            names(
                r#"label_values(etcd_grpc_proxy_upstream_failovers_total{job=~"$job"}, instance)"#
            ),
            ["etcd_grpc_proxy_upstream_failovers_total"]
        );
    }

    #[test]
    fn unbalanced_expressions_are_refused() {
        assert!(metric_names("sum(rate(x[5m])").is_err());
        assert!(metric_names(r#"x{a="b}"#).is_err());
    }

    fn exported() -> BTreeMap<String, String> {
        exported_families(
            "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n\
             # TYPE lat_seconds histogram\nlat_seconds_bucket{le=\"1\"} 0\n",
        )
    }

    #[test]
    fn a_misspelled_metric_is_not_exported() {
        let used = metric_names("rate(a_totl[5m]) + rate(a_total[5m])").unwrap();
        assert_eq!(
            not_exported(&used, &exported())
                .into_iter()
                .collect::<Vec<_>>(),
            ["a_totl"]
        );
    }

    #[test]
    fn only_a_histogram_has_bucket_sum_and_count_series() {
        let used = metric_names(
            "lat_seconds_bucket + lat_seconds_sum + lat_seconds_count + a_total_bucket + a_total_count",
        )
        .unwrap();
        assert_eq!(
            not_exported(&used, &exported())
                .into_iter()
                .collect::<Vec<_>>(),
            ["a_total_bucket", "a_total_count"]
        );
    }
}
