//! Where etcd's versions differ in how a watch stream answers, read off the version a member's Status reports.
//!
//! Clients see etcd's own behaviour through the proxy, so where versions differ the proxy answers as the member
//! behind it would. A version that does not read as major.minor.patch is taken for the newest behaviour: etcd has
//! always reported its version so, so another form would come from an etcd newer than this code.

/// The major.minor.patch of an etcd version. A pre-release ("3.6.0-rc.0") counts as its release.
pub fn release(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.split(['-', '+']).next()?;
    let numbers: Vec<u32> = core
        .split('.')
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    match numbers[..] {
        [major, minor, patch] => Some((major, minor, patch)),
        _ => None,
    }
}

/// Whether etcd of this version answers a progress request on a stream that has no watchers. Before 3.5.8 etcd
/// answers every progress request at once; from 3.5.8 (and in 3.6 and 3.7) it answers only when every watcher of
/// the stream is synced, and sends nothing on a stream with none (etcd PR #15237's `RequestProgressAll`).
/// 3.4 answers every one.
pub fn answers_progress_without_watchers(version: Option<&str>) -> bool {
    match version.and_then(release) {
        Some(v) => v < (3, 5, 8),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_read_as_etcd_writes_them() {
        assert_eq!(release("3.5.30"), Some((3, 5, 30)));
        assert_eq!(release("3.6.0-rc.0"), Some((3, 6, 0)));
        assert_eq!(release("3.5.1+build"), Some((3, 5, 1)));
        for garbage in ["", "3.5", "3.5.x", "3.5.1.2", "garbage"] {
            assert_eq!(release(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn progress_on_a_stream_without_watchers_is_answered_before_3_5_8_only() {
        for old in ["3.4.23", "3.5.1", "3.5.7"] {
            assert!(answers_progress_without_watchers(Some(old)), "{old}");
        }
        for new in ["3.5.8", "3.5.30", "3.6.0", "3.7.1", "unreadable"] {
            assert!(!answers_progress_without_watchers(Some(new)), "{new}");
        }
        assert!(!answers_progress_without_watchers(None));
    }
}
