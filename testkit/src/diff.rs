//! A readable line diff of two outputs, for failure reports: the same lines with four spaces, lines only in the
//! first with `  - `, lines only in the second with `  + `.

/// The line diff of `a` and `b` (a longest common subsequence; outputs here are small), `    <empty>` when both
/// are empty.
pub fn line_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out.push(format!("    {}", a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            out.push(format!("  + {}", b[j]));
            j += 1;
        } else {
            out.push(format!("  - {}", a[i]));
            i += 1;
        }
    }
    if out.is_empty() {
        return "    <empty>".to_string();
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_and_added_lines_are_marked() {
        assert_eq!(
            line_diff("a\nb\nc", "a\nx\nc"),
            "    a\n  + x\n  - b\n    c"
        );
        assert_eq!(line_diff("a", ""), "  - a");
        assert_eq!(line_diff("", ""), "    <empty>");
    }
}
